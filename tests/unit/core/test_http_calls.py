"""HTTP calls to services: sent for real to servers on the loopback, retried within bounds,
and never raising for the service's part."""

from __future__ import annotations

import pytest

from repromatrix.http_calls import Call, deliver, json_call, send, url_problem
from support.registry import stand_in_registry
from support.webhook import free_port, receiver


def no_sleep(_seconds: float) -> None:
    pass


def test_a_json_call_is_sent_as_it_is_described() -> None:
    call = json_call("POST", "", {"b": 1, "a": [2]}, {"Authorization": "Bearer t0ken"},
                     frozenset({"Authorization"}))  # fmt: skip
    with receiver(status=201, answer={"number": 7}) as server:
        reply = send(Call(call.method, f"{server.url}/x", call.headers, call.body))
    assert reply.ok and reply.json() == {"number": 7}
    [got] = server.got
    assert (got.method, got.path, got.json()) == ("POST", "/x", {"a": [2], "b": 1})
    assert got.headers["Authorization"] == "Bearer t0ken"
    assert call.described()["headers"]["Authorization"] == "<secret>"
    assert "t0ken" not in str(call.described())


def test_a_service_that_fails_is_tried_again_at_most_the_attempts_given() -> None:
    waits: list[float] = []
    with receiver(status=503) as server:
        delivery = deliver(Call("POST", server.url, body=b"{}"), attempts=3, sleep=waits.append)
    assert not delivery.ok and len(server.got) == 3
    assert waits == [1.0, 2.0]  # backing off between attempts
    assert delivery.words == "failed after 3 attempts: HTTP 503"


def test_a_refusal_is_final_and_not_tried_again() -> None:
    with receiver(status=401) as server:
        delivery = deliver(Call("POST", server.url), attempts=5, sleep=no_sleep)
    assert len(server.got) == 1 and delivery.last.status == 401


def test_a_url_nothing_listens_on_is_no_answer_not_an_exception() -> None:
    delivery = deliver(Call("POST", f"http://127.0.0.1:{free_port()}/"), 2, sleep=no_sleep)
    assert not delivery.ok and len(delivery.replies) == 2
    assert delivery.last.status is None and "no answer from http://127.0.0.1" in delivery.words


def test_a_service_that_hangs_is_cut_at_the_timeout() -> None:
    with receiver(hang=True) as server:
        delivery = deliver(Call("POST", server.url), attempts=2, timeout_s=0.5, sleep=no_sleep)
    assert not delivery.ok and len(server.got) == 2
    assert "timed out" in delivery.words


def test_a_passing_failure_then_success_is_delivered() -> None:
    with receiver(status=500) as server:
        first = send(Call("POST", server.url))
        server.status = 200
        delivery = deliver(Call("POST", server.url), attempts=3, sleep=no_sleep)
    assert first.passing and delivery.ok and delivery.words == "delivered (HTTP 200)"


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("ftp://example.com/hook", "is not an http(s) URL"),
        ("file:///etc/passwd", "is not an http(s) URL"),
        ("hooks.example.com/x", "is not an http(s) URL"),
        ("http:///x", "names no host"),
        ("https://example.com/a b", "a space or a control character"),
    ],
)
def test_only_http_and_https_urls_are_sent_to(url: str, problem: str) -> None:
    assert problem in (url_problem(url) or "")


def test_a_good_url_has_no_problem() -> None:
    assert url_problem("https://hooks.example.com/repromatrix?team=a") is None
    assert url_problem("http://127.0.0.1:8080/") is None


@pytest.mark.parametrize("target", ["other host", "file"])
def test_a_redirect_off_the_host_is_not_followed_and_the_token_stays(target: str) -> None:
    """Issue 34: a service's redirect took the request (and its token) to any host."""
    with stand_in_registry() as asked, stand_in_registry("127.0.0.2") as bystander:
        elsewhere = f"http://{bystander.host}/v2/x/tags/list"
        asked.redirect = elsewhere if target == "other host" else "file:///etc/passwd"
        call = Call("GET", f"http://{asked.host}/v2/x/tags/list", {"Authorization": "Bearer t"})
        reply = send(call)
    assert not reply.ok and bystander.asked == []
    if target == "other host":
        assert reply.status is None and "not followed" in reply.error


def test_a_redirect_on_the_same_host_is_followed() -> None:
    with stand_in_registry() as asked:
        asked.redirect = None
        reply = send(Call("GET", f"http://{asked.host}/v2/x/tags/list"))
    assert reply.ok
