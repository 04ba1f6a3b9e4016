"""`--cors-origins` on the command line: a browser's preflight and request, as a page sends them."""

import urllib.error
import urllib.request


def preflight(server, origin):
    request = urllib.request.Request(
        server.base_url + "/chat/completions",
        method="OPTIONS",
        headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "content-type"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, r.headers
    except urllib.error.HTTPError as e:
        return e.code, e.headers


def test_listed_origins_get_answers_and_others_do_not(cors_server):
    status, headers = preflight(cors_server, "http://127.0.0.1:5173")
    assert status == 204
    assert headers["Access-Control-Allow-Origin"] == "http://127.0.0.1:5173"
    assert "POST" in headers["Access-Control-Allow-Methods"]
    status, headers = preflight(cors_server, "http://evil.example")
    assert headers["Access-Control-Allow-Origin"] is None


def test_cors_is_off_by_default(server):
    status, headers = preflight(server, "http://localhost:3000")
    assert status == 405
    assert headers["Access-Control-Allow-Origin"] is None
