#!/usr/bin/env python3
"""Prefix-cache figures against a running `spindle serve` (standard library only).

ttft:  time to first token (a max_tokens=1 request, prefill plus one token) of a chat whose
       system prompt holds about --prefix-words words, first cold (a system prompt never sent
       before) and then for a second question after the same system prompt (served from the
       cache). Run it against `--no-prefix-cache` too for the cold time without snapshots.
agent: a --turns-turn agent loop over a system prompt of about --system-words words: each turn
       sends the whole conversation so far plus a new user message; reports the prompt tokens
       the server computed (prompt_tokens - cached_tokens) against the tokens that were new
       (the first prompt whole, then what each prompt adds beyond the previous prompt and its
       answer).

usage: tools/prefix_cache_bench.py URL ttft|agent [--prefix-words N] [--system-words N]
       [--turns N] [--runs N] [--seed N]
"""

import argparse
import json
import random
import statistics
import time
import urllib.request

WORDS = (
    "the a of to and in that is for it with as was on be by this are from at or an have not "
    "river engine table window garden number system station letter market answer village "
    "history morning picture question service language machine children mountain weather "
    "program account circle element surface company problem evening library bridge theory "
    "measure orange silver winter yellow planet forest harbor signal record ticket sister "
    "careful quickly between without against through during before after under around"
).split()


def text(words, rng):
    return " ".join(rng.choice(WORDS) for _ in range(words)) + "."


def post(url, body):
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=3600) as r:
        answer = json.load(r)
    return time.perf_counter() - start, answer


def chat(system, messages, max_tokens):
    return {
        "model": "m",
        "temperature": 0,
        "max_tokens": max_tokens,
        "messages": [{"role": "system", "content": system}] + messages,
    }


def ttft(args):
    rows = []
    for run in range(args.runs):
        rng = random.Random(args.seed * 1000 + run)
        system = text(args.prefix_words, rng)
        cold_s, cold = post(args.url, chat(system, [{"role": "user", "content": text(12, rng)}], 1))
        warm_s, warm = post(args.url, chat(system, [{"role": "user", "content": text(12, rng)}], 1))
        rows.append((cold_s, warm_s, cold["usage"], warm["usage"]))
        print(
            f"run {run}: cold {cold_s * 1000:.0f} ms ({cold['usage']['prompt_tokens']} tokens, "
            f"{cold['usage']['prompt_tokens_details']['cached_tokens']} cached), "
            f"warm {warm_s * 1000:.0f} ms ({warm['usage']['prompt_tokens']} tokens, "
            f"{warm['usage']['prompt_tokens_details']['cached_tokens']} cached)"
        )
    cold = statistics.median(r[0] for r in rows)
    warm = statistics.median(r[1] for r in rows)
    print(f"median: cold {cold * 1000:.0f} ms, warm {warm * 1000:.0f} ms, warm/cold {warm / cold:.3f}")


def agent(args):
    rng = random.Random(args.seed)
    system = text(args.system_words, rng)
    messages = []
    computed = new = 0
    previous = None
    for turn in range(args.turns):
        messages.append({"role": "user", "content": text(40, rng)})
        _, answer = post(args.url, chat(system, messages, 32))
        usage = answer["usage"]
        prompt, cached = usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]
        fresh = prompt if previous is None else prompt - previous
        computed += prompt - cached
        new += fresh
        previous = prompt + usage["completion_tokens"]
        print(f"turn {turn + 1}: prompt {prompt}, cached {cached}, computed {prompt - cached}, new {fresh}")
        content = answer["choices"][0]["message"].get("content") or ""
        messages.append({"role": "assistant", "content": content})
    print(f"total: computed {computed}, new {new}, computed/new {computed / new:.3f}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("url")
    p.add_argument("mode", choices=["ttft", "agent"])
    p.add_argument("--prefix-words", type=int, default=3000)
    p.add_argument("--system-words", type=int, default=1500)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    args.url = args.url.rstrip("/")
    (ttft if args.mode == "ttft" else agent)(args)


if __name__ == "__main__":
    main()
