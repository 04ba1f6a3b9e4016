//! The logits-processing controls over HTTP: every accepted field listed (anything else is
//! refused by name), structured outputs (`response_format`, vLLM's and llama-server's fields,
//! forced tool calls), `logit_bias`, `stop_token_ids`, `min_tokens`, logprobs (whole and
//! streamed), `n` with per-choice seeds, and `echo`.

use serde_json::{json, Value};

use crate::common::{user, TestServer};

/// Every field `/v1/chat/completions` accepts: those it implements and those it ignores
/// because they do not change the output.
const CHAT_FIELDS: &[&str] = &[
    "model",
    "messages",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "seed",
    "stop",
    "n",
    "logprobs",
    "top_logprobs",
    "logit_bias",
    "stop_token_ids",
    "min_tokens",
    "ignore_eos",
    "skip_special_tokens",
    "include_stop_str_in_output",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "chat_template_kwargs",
    "reasoning_effort",
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "grammar",
    "json_schema",
];

const COMPLETION_FIELDS: &[&str] = &[
    "model",
    "prompt",
    "special_tokens",
    "echo",
    "suffix",
    "best_of",
    "stream",
    "stream_options",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "seed",
    "stop",
    "n",
    "logprobs",
    "logit_bias",
    "stop_token_ids",
    "min_tokens",
    "ignore_eos",
    "skip_special_tokens",
    "include_stop_str_in_output",
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "grammar",
    "json_schema",
];

const IGNORED: &[&str] = &[
    "user",
    "metadata",
    "store",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
    "prediction",
    "guided_decoding_backend",
    "request_id",
    "priority",
];

/// Fields other servers read that would change the output and are not implemented here.
const REFUSED: &[&str] = &[
    "functions",
    "function_call",
    "audio",
    "modalities",
    "web_search_options",
    "verbosity",
    "guided_whitespace_pattern",
    "structural_tag",
    "bad_words",
    "allowed_token_ids",
    "prompt_logprobs",
    "use_beam_search",
    "length_penalty",
    "truncate_prompt_tokens",
    "no_such_field",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_accepted_field_is_listed_and_others_are_refused_by_name() {
    let server = TestServer::start(|_| {}).await;
    let base = |path: &str| match path {
        "/v1/chat/completions" => json!({"messages": user("hi"), "max_tokens": 2}),
        _ => json!({"prompt": "hi", "max_tokens": 2}),
    };
    for (path, fields) in [
        ("/v1/chat/completions", CHAT_FIELDS),
        ("/v1/completions", COMPLETION_FIELDS),
    ] {
        // A null value is "not set": every listed field is accepted so.
        for field in fields.iter().chain(IGNORED) {
            let mut body = base(path);
            if body.get(*field).is_none() {
                body[*field] = Value::Null;
            }
            let (status, answer) = server.post(path, &body).await;
            assert_eq!(status, 200, "{path} {field}: {answer}");
        }
        for field in REFUSED {
            let mut body = base(path);
            body[*field] = json!(1);
            let (status, answer) = server.post(path, &body).await;
            assert_eq!(status, 400, "{path} {field}: {answer}");
            assert_eq!(answer["error"]["param"], *field, "{answer}");
        }
    }
    // A chat-only field is refused on completions.
    let (status, answer) = server
        .post("/v1/completions", &json!({"prompt": "hi", "tools": []}))
        .await;
    assert_eq!(
        (status, answer["error"]["param"].as_str()),
        (400, Some("tools"))
    );
}

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 10},
            "age": {"type": "integer", "minimum": 1, "maximum": 99},
            "pets": {"type": "array", "items": {"enum": ["cat", "dog"]}, "maxItems": 2}
        },
        "required": ["name", "age", "pets"],
        "additionalProperties": false
    })
}

fn check_person(text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    assert!(
        v["name"].as_str().is_some_and(|n| n.chars().count() <= 10),
        "{v}"
    );
    assert!(
        v["age"].as_i64().is_some_and(|a| (1..=99).contains(&a)),
        "{v}"
    );
    assert!(v["pets"].as_array().is_some_and(|p| p.len() <= 2), "{v}");
}

async fn chat_text(server: &TestServer, extra: Value) -> (Value, String) {
    let mut body =
        json!({"messages": user("A person, please."), "max_tokens": 120, "temperature": 0});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let (status, answer) = server.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{answer}");
    let text = answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    (answer, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structured_outputs_from_every_dialect() {
    let server = TestServer::start(|_| {}).await;
    let (_, free) = chat_text(&server, json!({})).await;
    assert!(serde_json::from_str::<Value>(&free).is_err(), "{free:?}");
    let schema = person_schema();
    for extra in [
        json!({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schema, "strict": true}}}),
        json!({"response_format": {"type": "json_object", "schema": schema}}),
        json!({"guided_json": schema}),
        json!({"guided_json": schema.to_string()}),
        json!({"structured_outputs": {"json": schema}}),
        json!({"json_schema": schema}),
    ] {
        let (answer, text) = chat_text(&server, extra.clone()).await;
        assert_eq!(
            answer["choices"][0]["finish_reason"], "stop",
            "{extra}: {answer}"
        );
        check_person(&text);
    }
    let (_, text) = chat_text(&server, json!({"guided_choice": ["yes", "no", "maybe so"]})).await;
    assert!(
        ["yes", "no", "maybe so"].contains(&text.as_str()),
        "{text:?}"
    );
    let (_, text) = chat_text(&server, json!({"guided_regex": "[A-Z][a-z]{2,5}!"})).await;
    assert!(
        text.ends_with('!') && text.starts_with(|c: char| c.is_ascii_uppercase()),
        "{text:?}"
    );
    let (_, text) = chat_text(
        &server,
        json!({"guided_grammar": "start: \"a\" \"b\"+ \"c\"\n"}),
    )
    .await;
    assert!(text.starts_with("ab") && text.ends_with('c'), "{text:?}");

    // Bad grammars are a 400 naming the field.
    for (extra, param) in [
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frob"}}}}),
            "response_format",
        ),
        (
            json!({"response_format": {"type": "xml"}}),
            "response_format.type",
        ),
        (json!({"guided_regex": "(a"}), "guided_regex"),
        (
            json!({"guided_grammar": "root ::= \"a\""}),
            "guided_grammar",
        ),
        (json!({"guided_choice": []}), "guided_choice"),
        (
            json!({"guided_json": schema, "guided_regex": "a"}),
            "guided_regex",
        ),
        (
            json!({"guided_json": schema, "ignore_eos": true}),
            "ignore_eos",
        ),
    ] {
        let mut body = json!({"messages": user("x"), "max_tokens": 4});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (status, answer) = server.post("/v1/chat/completions", &body).await;
        assert_eq!(status, 400, "{extra}: {answer}");
        assert_eq!(answer["error"]["param"], param, "{answer}");
    }
    // Completions take the same fields.
    let (status, answer) = server
        .post(
            "/v1/completions",
            &json!({"prompt": "Q:", "max_tokens": 100, "guided_json": person_schema()}),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    check_person(answer["choices"][0]["text"].as_str().unwrap());
}

fn weather_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "unit": {"enum": ["c", "f"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7}
            },
            "required": ["city", "days"]
        }}},
        {"type": "function", "function": {"name": "get_time", "parameters": {
            "type": "object", "properties": {"zone": {"type": "string", "maxLength": 6}}, "required": ["zone"]
        }}}
    ])
}

/// A call of one of [`weather_tools`] whose arguments its schema allows.
fn check_weather_call(call: &Value) {
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    match call["function"]["name"].as_str().unwrap() {
        "get_weather" => {
            assert!(
                args["city"]
                    .as_str()
                    .is_some_and(|c| c.chars().count() <= 12),
                "{args}"
            );
            assert!(
                args["days"].as_i64().is_some_and(|d| (1..=7).contains(&d)),
                "{args}"
            );
            assert!(
                args.get("unit").is_none_or(|u| u == "c" || u == "f"),
                "{args}"
            );
        }
        "get_time" => assert!(
            args["zone"]
                .as_str()
                .is_some_and(|z| z.chars().count() <= 6),
            "{args}"
        ),
        other => panic!("not a weather tool: {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_choice_required_and_named_force_valid_calls() {
    let server = TestServer::start(|_| {}).await;
    let ask = |choice: Value, extra: Value| {
        let mut body = json!({"messages": user("Weather in Paris?"), "tools": weather_tools(),
                              "tool_choice": choice, "max_tokens": 150, "temperature": 0});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    // Left to itself the random model calls nothing.
    let (_, auto) = server
        .post("/v1/chat/completions", &ask(json!("auto"), json!({})))
        .await;
    assert!(
        auto["choices"][0]["message"].get("tool_calls").is_none(),
        "{auto}"
    );
    for name in ["get_weather", "get_time"] {
        let named = json!({"type": "function", "function": {"name": name}});
        for stream in [false, true] {
            let body = ask(named.clone(), json!({"stream": stream}));
            let calls: Vec<Value> = if stream {
                let (status, chunks) = server.post_stream("/v1/chat/completions", &body).await;
                assert_eq!(status, 200);
                chunks
                    .iter()
                    .filter(|c| *c != "[DONE]")
                    .filter_map(|c| serde_json::from_str::<Value>(c).ok())
                    .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array().cloned())
                    .flatten()
                    .collect()
            } else {
                let (status, answer) = server.post("/v1/chat/completions", &body).await;
                assert_eq!(status, 200, "{answer}");
                assert_eq!(
                    answer["choices"][0]["finish_reason"], "tool_calls",
                    "{answer}"
                );
                answer["choices"][0]["message"]["tool_calls"]
                    .as_array()
                    .unwrap()
                    .clone()
            };
            assert_eq!(calls.len(), 1, "{calls:?}");
            assert_eq!(calls[0]["function"]["name"], name);
            check_weather_call(&calls[0]);
        }
    }
    let (status, answer) = server
        .post(
            "/v1/chat/completions",
            &ask(json!("required"), json!({"parallel_tool_calls": false})),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    let calls = answer["choices"][0]["message"]["tool_calls"]
        .as_array()
        .unwrap();
    assert_eq!(calls.len(), 1, "{answer}");
    assert!(["get_weather", "get_time"].contains(&calls[0]["function"]["name"].as_str().unwrap()));
}

/// Strict tools under `tool_choice` "auto" (OpenAI's structured outputs for function calls): a
/// call the model makes holds arguments its schema allows. The random model is pushed into a
/// call by a logit bias on `<tool_call>`; a `strict` that is not a boolean is refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_tools_hold_unforced_calls_to_their_schemas() {
    let server = TestServer::start(|_| {}).await;
    let (model, _) = crate::common::demo();
    let open = model.tokenizer.token_to_id("<tool_call>").unwrap();
    let mut tools = weather_tools();
    for tool in tools.as_array_mut().unwrap() {
        tool["function"]["strict"] = json!(true);
    }
    let mut bias = serde_json::Map::new();
    bias.insert(open.to_string(), json!(100));
    let body = json!({"messages": user("Weather in Paris?"), "tools": tools, "max_tokens": 150,
                      "temperature": 0, "parallel_tool_calls": false, "logit_bias": bias});
    let (status, answer) = server.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{answer}");
    let calls = answer["choices"][0]["message"]["tool_calls"]
        .as_array()
        .unwrap_or_else(|| panic!("a call: {answer}"));
    assert_eq!(calls.len(), 1, "{answer}");
    check_weather_call(&calls[0]);
    let mut bad = body.clone();
    bad["tools"][0]["function"]["strict"] = json!("yes");
    let (status, answer) = server.post("/v1/chat/completions", &bad).await;
    assert_eq!(status, 400, "{answer}");
    assert!(answer.to_string().contains("strict"), "{answer}");
}

/// The greedy answer's token ids for `text`, from the model itself.
fn greedy_ids(text: &str, max_tokens: usize) -> Vec<u32> {
    use spindle_server::spindle_runtime::{Flow, GenerateOptions, Prompt};
    let (model, _) = crate::common::demo();
    let prompt = model
        .prepare(&Prompt::Chat {
            messages: user(text),
            tools: None,
            vars: Default::default(),
            add_generation_prompt: true,
        })
        .unwrap();
    let mut session = model.new_session().unwrap();
    let options = GenerateOptions {
        max_tokens: Some(max_tokens),
        ..GenerateOptions::default()
    };
    model
        .generate(&mut session, &prompt.ids, &options, &mut |_| Flow::Continue)
        .unwrap()
        .ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logit_bias_stop_token_ids_and_min_tokens() {
    let server = TestServer::start(|_| {}).await;
    let ask = |extra: Value| {
        let mut b =
            json!({"messages": user("Tell me a story."), "max_tokens": 8, "temperature": 0});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let ids = greedy_ids("Tell me a story.", 8);
    let (_, base) = server.post("/v1/chat/completions", &ask(json!({}))).await;
    let text = |a: &Value| {
        a["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    // -100 on the greedy first token changes the answer.
    let (status, banned) = server
        .post(
            "/v1/chat/completions",
            &ask(json!({"logit_bias": {ids[0].to_string(): -100}})),
        )
        .await;
    assert_eq!(status, 200, "{banned}");
    assert_ne!(text(&banned), text(&base));
    // A stop token id ends the answer before that token's text.
    let (_, stopped) = server
        .post(
            "/v1/chat/completions",
            &ask(json!({"stop_token_ids": [ids[3]]})),
        )
        .await;
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop", "{stopped}");
    let k = ids.iter().position(|&id| id == ids[3]).unwrap();
    assert_eq!(stopped["usage"]["completion_tokens"], k + 1, "{stopped}");
    // An EOS forced by +100 comes only after min_tokens.
    let (model, _) = crate::common::demo();
    let eos = model.eos_ids[0].to_string();
    let (_, ended) = server
        .post(
            "/v1/chat/completions",
            &ask(json!({"logit_bias": {eos.clone(): 100}})),
        )
        .await;
    assert_eq!(ended["usage"]["completion_tokens"], 1, "{ended}");
    let (_, held) = server
        .post(
            "/v1/chat/completions",
            &ask(json!({"logit_bias": {eos: 100}, "min_tokens": 5})),
        )
        .await;
    assert_eq!(held["usage"]["completion_tokens"], 6, "{held}");
    assert_eq!(held["choices"][0]["finish_reason"], "stop");
    // Out-of-range ids and biases name the field.
    for (extra, param) in [
        (json!({"logit_bias": {"abc": 1}}), "logit_bias.abc"),
        (json!({"logit_bias": {"5": 101}}), "logit_bias.5"),
        (json!({"min_tokens": -1}), "min_tokens"),
        (
            json!({"logit_bias": {"99999999": 1}}),
            "logit_bias.99999999",
        ),
        (json!({"stop_token_ids": [99999999]}), "stop_token_ids"),
        (json!({"top_logprobs": 3}), "top_logprobs"),
        (
            json!({"logprobs": true, "top_logprobs": 21}),
            "top_logprobs",
        ),
    ] {
        let (status, answer) = server
            .post("/v1/chat/completions", &ask(extra.clone()))
            .await;
        assert_eq!(
            (status, answer["error"]["param"].as_str()),
            (400, Some(param)),
            "{extra}: {answer}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_whole_and_streamed_agree() {
    let server = TestServer::start(|_| {}).await;
    // Greedy without the demo's default repetition penalty: the chosen token is the raw
    // logits' argmax (logprobs are of the raw logits).
    let body = json!({"messages": user("Hello"), "max_tokens": 6, "temperature": 0,
                      "repetition_penalty": 1, "logprobs": true, "top_logprobs": 3});
    let (status, whole) = server.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{whole}");
    let content = whole["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(content.len(), 6);
    for t in &content {
        let top = t["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        // Greedy: the chosen token is the most likely, and the alternatives descend.
        assert_eq!(top[0]["token"], t["token"]);
        assert!(
            (top[0]["logprob"].as_f64().unwrap() - t["logprob"].as_f64().unwrap()).abs() < 1e-6
        );
        assert!(top
            .windows(2)
            .all(|w| w[0]["logprob"].as_f64() >= w[1]["logprob"].as_f64()));
        assert!(t["logprob"].as_f64().unwrap() <= 0.0);
        assert_eq!(
            t["bytes"].as_array().unwrap().len(),
            t["token"].as_str().unwrap().len()
        );
    }
    let mut streamed_body = body.clone();
    streamed_body["stream"] = json!(true);
    let (_, chunks) = server
        .post_stream("/v1/chat/completions", &streamed_body)
        .await;
    let streamed: Vec<Value> = chunks
        .iter()
        .filter(|c| *c != "[DONE]")
        .map(|c| serde_json::from_str::<Value>(c).unwrap())
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array().cloned())
        .flatten()
        .collect();
    assert_eq!(streamed, content);

    // Completions: a number of alternatives, and echo with the prompt's own.
    let (status, text) = server
        .post(
            "/v1/completions",
            &json!({"prompt": "The cat sat", "max_tokens": 4, "logprobs": 2, "echo": true}),
        )
        .await;
    assert_eq!(status, 200, "{text}");
    let choice = &text["choices"][0];
    assert!(choice["text"].as_str().unwrap().starts_with("The cat sat"));
    let lp = &choice["logprobs"];
    let n = lp["tokens"].as_array().unwrap().len();
    assert_eq!(
        n as u64,
        text["usage"]["prompt_tokens"].as_u64().unwrap() + 4,
        "{lp}"
    );
    assert!(lp["token_logprobs"][0].is_null());
    assert!(lp["token_logprobs"][1].as_f64().unwrap() < 0.0);
    assert_eq!(lp["top_logprobs"][5].as_object().unwrap().len(), 2);
    let offsets: Vec<u64> = lp["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_u64().unwrap())
        .collect();
    assert_eq!(offsets[0], 0);
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]));
    let joined: String = lp["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(joined, choice["text"].as_str().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_choices_each_match_the_single_request_with_their_seed() {
    let server = TestServer::start(|_| {}).await;
    let body = |n: usize, seed: u64, stream: bool| {
        json!({"messages": user("Once upon a time"), "max_tokens": 10, "temperature": 1.0,
               "seed": seed, "n": n, "stream": stream, "stream_options": {"include_usage": true}})
    };
    let (status, many) = server
        .post("/v1/chat/completions", &body(3, 40, false))
        .await;
    assert_eq!(status, 200, "{many}");
    let choices = many["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    let mut total = 0;
    for (i, choice) in choices.iter().enumerate() {
        assert_eq!(choice["index"], i);
        let (_, one) = server
            .post("/v1/chat/completions", &body(1, 40 + i as u64, false))
            .await;
        assert_eq!(
            choice["message"], one["choices"][0]["message"],
            "choice {i}"
        );
        total += one["usage"]["completion_tokens"].as_u64().unwrap();
    }
    assert_ne!(choices[0]["message"], choices[1]["message"]);
    assert_eq!(many["usage"]["completion_tokens"], total);
    // Streamed: each index's deltas join to that choice's text; usage comes once, last.
    let (_, chunks) = server
        .post_stream("/v1/chat/completions", &body(3, 40, true))
        .await;
    let parsed: Vec<Value> = chunks
        .iter()
        .filter(|c| *c != "[DONE]")
        .map(|c| serde_json::from_str(c).unwrap())
        .collect();
    for (i, choice) in choices.iter().enumerate() {
        let text: String = parsed
            .iter()
            .filter_map(|c| c["choices"].as_array()?.first().cloned())
            .filter(|c| c["index"] == i)
            .filter_map(|c| c["delta"]["content"].as_str().map(str::to_owned))
            .collect();
        assert_eq!(
            text,
            choice["message"]["content"].as_str().unwrap(),
            "choice {i}"
        );
    }
    let usage: Vec<&Value> = parsed.iter().filter(|c| c["usage"].is_object()).collect();
    assert_eq!(usage.len(), 1);
    assert_eq!(usage[0]["usage"]["completion_tokens"], total);
    assert_eq!(chunks.last().unwrap(), "[DONE]");
    // Completions too.
    let (status, text) = server
        .post(
            "/v1/completions",
            &json!({"prompt": "a b c", "max_tokens": 5, "n": 2, "temperature": 1, "seed": 1}),
        )
        .await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(text["choices"].as_array().unwrap().len(), 2);
    assert_eq!(text["choices"][1]["index"], 1);
}
