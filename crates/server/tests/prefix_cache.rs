//! The prefix cache through the server: a second request with the same 200-token system
//! prompt reports cached prompt tokens in its usage (plain and streamed) and gets the answer a
//! server without a cache gives; `/metrics` counts the hits and the KV blocks the cache holds;
//! `--no-prefix-cache` reports none.

#[path = "server/common.rs"]
#[allow(dead_code)]
mod common;

use serde_json::{json, Value};
use spindle_server::PrefixCacheOptions;

use common::{metric, TestServer};

const SYSTEM: &str = "You are the help desk of a city library. You answer questions about \
opening hours, library cards, borrowing limits, late fees, the reading rooms, the children's \
section, the archive of old newspapers, printing and scanning, the public computers, the wifi, \
events such as author talks and reading groups, and how to reserve a book that is out on loan. \
Be brief and friendly. If a question is about something the library does not offer, say so \
plainly and suggest where the visitor might ask instead. Never make up opening hours or fees: \
when you do not know them, tell the visitor to check the notice board by the main entrance or \
to ask at the front desk. Do not give legal or medical advice. When a visitor seems lost, \
describe the way from the main entrance: the lifts are on the left, the stairs on the right, \
the reading rooms on the second floor and the archive in the basement.";

fn request(question: &str) -> Value {
    json!({"model": "m", "temperature": 0, "max_tokens": 12, "messages": [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": question},
    ]})
}

fn cached(usage: &Value) -> u64 {
    usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no cached_tokens in {usage}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_system_prompt_is_served_from_the_cache() {
    let server = TestServer::start(|c| {
        c.prefix_cache = Some(PrefixCacheOptions {
            bytes: 1 << 30,
            interval: 256,
        })
    })
    .await;
    let plain = TestServer::start(|c| c.prefix_cache = None).await;

    let (status, first) = server
        .post("/v1/chat/completions", &request("When do you open?"))
        .await;
    assert_eq!(status, 200, "{first}");
    let prompt_tokens = first["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(
        prompt_tokens >= 200,
        "the system prompt is {prompt_tokens} tokens"
    );
    assert_eq!(cached(&first["usage"]), 0, "nothing was cached before");

    let second_request = request("How many books may I borrow?");
    let (status, second) = server.post("/v1/chat/completions", &second_request).await;
    assert_eq!(status, 200, "{second}");
    let hit = cached(&second["usage"]);
    assert!(hit >= 180 && hit < prompt_tokens, "{hit} cached tokens");
    let (_, cold) = plain.post("/v1/chat/completions", &second_request).await;
    assert_eq!(cached(&cold["usage"]), 0);
    assert_eq!(
        second["choices"][0]["message"], cold["choices"][0]["message"],
        "the cached answer differs from the cold one"
    );

    // Streamed, with usage on the last chunk.
    let mut streamed = request("Is there wifi?");
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let (status, events) = server.post_stream("/v1/chat/completions", &streamed).await;
    assert_eq!(status, 200);
    let last: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert!(cached(&last["usage"]) >= 180, "{last}");

    let metrics = server.metrics().await;
    assert!(metric(&metrics, "spindle_prefix_cache_hit_tokens_total") >= 2.0 * 180.0);
    assert!(metric(&metrics, "spindle_prefix_cache_miss_tokens_total") >= prompt_tokens as f64);
    assert_eq!(metric(&metrics, "spindle_prefix_cache_enabled"), 1.0);
    assert!(metric(&metrics, "spindle_prefix_cache_bytes") > 0.0);
    assert!(metric(&metrics, "spindle_prefix_cache_entries") > 0.0);
    assert_eq!(
        metric(&metrics, "spindle_prefix_cache_evictions_total"),
        0.0
    );
    // The CPU's paged KV: the cache holds the system prompt's blocks (16 tokens each) once
    // the requests are done, and the pool has room left.
    assert!(
        metric(&metrics, "spindle_kv_blocks_used") >= (prompt_tokens / 16) as f64,
        "the cached prompts' blocks"
    );
    assert!(metric(&metrics, "spindle_kv_blocks_free") > 0.0);
    assert!(metric(&metrics, "spindle_kv_block_bytes") > 0.0);

    let metrics = plain.metrics().await;
    assert_eq!(metric(&metrics, "spindle_prefix_cache_enabled"), 0.0);
    assert_eq!(
        metric(&metrics, "spindle_prefix_cache_hit_tokens_total"),
        0.0
    );
    assert_eq!(metric(&metrics, "spindle_prefix_cache_entries"), 0.0);
    server.stop().await;
    plain.stop().await;
}
