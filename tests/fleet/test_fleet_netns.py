"""Three SIMULATED boxes, each in its own network namespace, behind the front (the real vllm-router and the
moet-panel gateway) and driven by the real openai SDK (issue 51; bench/fleet/netboxes.py builds it all and removes
it all, even on failure). Faults: a link cut, a gateway frozen (SIGSTOP), a lossy link, a slow lossy link (a delaying relay: no netem
here), a box switching profile, a box upgraded to a candidate build and rolled back,
the router killed. The figures are bench/fleet/run.py's; here each behaviour is asserted with generous deadlines."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from bench.fleet.netboxes import Fleet, NamespacesUnavailable
from bench.fleet.run import MODEL, Client, Result, longest_gap, loop, summary
from tests.polling import wait_for
from tests.fleet.hangup import hang_up
from tests.gateway.conftest import unsent

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


@pytest.fixture(scope="module")
def fleet() -> Iterator[tuple[Fleet, Client]]:
    f = Fleet(3, decode_tok_s=100, relays=True)  # each box behind its slow-link relay (delay 0 but in that test)
    try:
        f.__enter__()
    except NamespacesUnavailable as exc:
        pytest.fail(f"this machine cannot run the fleet tests: {exc}", pytrace=False)
    try:
        f.start()
        key = f.cli("keys", "create", "client").stdout.split()[0]
        f.enter_front()  # this thread and what it starts: in the front's namespace, where clients reach it
        yield f, Client(f.front_url, key, timeout_s=40)
    finally:
        router_log = f.tmp / "front" / ".moet-panel" / "router.log"
        if router_log.exists():
            print("--- router.log (tail)\n" + router_log.read_text(errors="replace")[-2500:])
        for p in [f.tmp / "front" / ".moet-panel" / "panel.log", *(b.data / ".moet-panel" / "panel.log" for b in f.boxes)]:
            if p.exists():  # the operator's logs of the run, for a failure's story
                lines = [ln for ln in p.read_text().splitlines() if "action=key_" not in ln]
                print(f"--- {p.parent.parent.name}/panel.log (tail)\n" + "\n".join(lines[-40:]))
        f.close()


def router_workers(f: Fleet) -> list[dict[str, object]]:
    r = httpx.get("http://127.0.0.1:30100/workers", timeout=5)
    return list(r.json()["workers"])


def healthy_in_router(f: Fleet) -> int:
    return sum(1 for w in router_workers(f) if w["is_healthy"])


def test_three_boxes_answer_at_once_through_one_front(fleet: tuple[Fleet, Client]) -> None:
    f, c = fleet
    assert healthy_in_router(f) == 3
    assert [m.id for m in c.sdk.models.list().data] == ["deepseek-v4-flash"]
    res: list[Result] = []
    ths = [threading.Thread(target=lambda: res.append(c.ask(40))) for _ in range(3)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    assert all(r.ok and r.tokens == 40 for r in res), summary(res)
    metrics = httpx.get("http://127.0.0.1:29100/metrics", timeout=5).text
    per_worker = [line for line in metrics.splitlines() if line.startswith("vllm_router_processed_requests_total{")]
    assert len(per_worker) == 3, per_worker  # every box answered some


def test_no_client_reaches_the_routers_admin_routes_through_the_front(fleet: tuple[Fleet, Client]) -> None:
    f, c = fleet
    auth = {"Authorization": f"Bearer {c.sdk.api_key}"}
    for path in ("/add_worker?url=http://127.0.0.1:9", "/remove_worker?url=" + f.boxes[0].url, "//remove_worker",
                 "/v1/../remove_worker", "/workers", "/v1/chat/completions/render", "/flush_cache"):
        for method in ("GET", "POST", "DELETE"):
            assert httpx.request(method, f.front_url + path, headers=auth, timeout=5).status_code == 404, (method, path)
    assert healthy_in_router(f) == 3 and len(router_workers(f)) == 3
    with pytest.raises(httpx.ConnectError):  # the router listens on the front's loopback only
        httpx.get(f"http://10.{f.r}.1.1:30100/workers", timeout=3)


def test_a_box_refuses_the_clients_key_and_no_key_and_answers_its_health_check(fleet: tuple[Fleet, Client]) -> None:
    f, c = fleet
    b = f.boxes[0]
    assert httpx.get(b.url + "/health", timeout=5).status_code == 200
    for headers in ({}, {"Authorization": f"Bearer {c.sdk.api_key}"}):
        assert httpx.get(b.url + "/v1/models", headers=headers, timeout=5).status_code == 401


def test_a_key_revoked_at_the_front_is_refused_within_a_second(fleet: tuple[Fleet, Client]) -> None:
    f, c = fleet
    k = f.cli("keys", "create", "short-lived").stdout.split()[0]
    c2 = Client(f.front_url, k)
    assert c2.ask(2).ok
    f.cli("keys", "revoke", "short-lived")
    t = time.monotonic()
    wait_for(lambda: c2.ask(2).status == 401, 1.5, "the revoked key refused")
    assert time.monotonic() - t <= 1.5


def test_usage_at_the_front_is_the_sum_of_the_boxes_engine_counters(fleet: tuple[Fleet, Client]) -> None:
    f, c = fleet

    def front_tokens() -> int:
        return sum(int(k["completion_tokens"]) for k in json.loads(f.cli("keys", "list", "--json").stdout))

    def engines() -> float:
        return sum(b.command("tokens", "tokens")["tokens"] for b in f.boxes)

    def boxes_billed() -> int:  # what the boxes' gateways billed the fleet key: all that went through the front
        return sum(int(b.command("tokens", "tokens")["gateway"]) for b in f.boxes)

    # the earlier tests' answers written at the front first (once a second): read before, one test's 120 tokens landed
    # inside this test's figure (seen: 210 for 90)
    wait_for(lambda: front_tokens() == boxes_billed(), 10, "the front's usage of the earlier tests written")
    front0, eng0 = front_tokens(), engines()
    rs = [c.ask(n) for n in (7, 11, 13, 17, 19, 23)]
    assert all(r.ok for r in rs), summary(rs)
    assert sum(r.tokens for r in rs) == 90
    wait_for(lambda: front_tokens() - front0 == 90, 10, "the front's usage written (once a second)")
    assert engines() - eng0 == 90


Counts = tuple[int, int]  # (prompt, completion) tokens


def _front_billed(f: Fleet) -> Counts:
    """Every key at the front (all of it went through the boxes): (prompt, completion) tokens."""
    keys = json.loads(f.cli("keys", "list", "--json").stdout)
    return sum(int(k["prompt_tokens"]) for k in keys), sum(int(k["completion_tokens"]) for k in keys)


def _boxes(f: Fleet) -> tuple[Counts, Counts]:
    """(what the boxes' gateways billed the fleet key, what their engines counted), summed over the boxes."""
    figs = [b.command("tokens", "tokens") for b in f.boxes]
    return ((sum(int(x["gateway_prompt"]) for x in figs), sum(int(x["gateway"]) for x in figs)),
            (sum(int(x["prompt"]) for x in figs), sum(int(x["tokens"]) for x in figs)))


def test_a_clients_key_at_the_front_is_billed_what_the_engines_did_whatever_the_client_did(
        fleet: tuple[Fleet, Client]) -> None:
    """Streams hung up mid-answer, a stream closed at its finish_reason chunk, a non-streaming request hung up while
    its box's engine generates, a whole stream and a whole answer, through the real router: the client's key at the
    front is billed the prompt and completion tokens the boxes billed the fleet key and their engines counted
    (docs/fleet.md "Usage at the front"). The router drops `continuous_usage_stats` and closes both its connections
    at a hang-up; before, the front billed a hung-up stream the last count it had and a non-streaming hang-up
    nothing. The boxes' canaries are off meanwhile (their tokens count on the engine, billed to nobody)."""
    f, c = fleet
    for b in f.boxes:
        b.command("canary 0", "canary")
    try:
        wait_for(lambda: not any(b.command("canary 0", "canary")["in_flight"] for b in f.boxes), 10, "no canary out")
        # the earlier tests' answers written at the front (once a second) before the starting figures
        wait_for(lambda: _front_billed(f) == _boxes(f)[0], 10, "the front's usage of the earlier tests written")
        front0, (box0, eng0) = _front_billed(f), _boxes(f)
        msg = [{"role": "user", "content": "tell me about experts"}]
        for _ in range(3):  # a stream hung up mid-answer, once on each box (round robin)
            stream = c.sdk.chat.completions.create(model=MODEL, messages=msg, max_tokens=1000, stream=True,
                                                   extra_body={"ignore_eos": True})
            it = iter(stream)
            for _ in range(20):
                next(it)
            stream.close()
        # a stream closed at its finish_reason chunk (it asked no usage: none reaches it)
        stream = c.sdk.chat.completions.create(model=MODEL, messages=msg, max_tokens=30, stream=True)
        for ch in stream:
            assert ch.usage is None
            if ch.choices and ch.choices[0].finish_reason:
                break
        stream.close()
        gen0 = _boxes(f)[1][1]
        hang_up(f.front_url, c.sdk.api_key, lambda: _boxes(f)[1][1] >= gen0 + 30, max_tokens=1000, ignore_eos=True, model=MODEL)
        chunks = list(c.sdk.chat.completions.create(model=MODEL, messages=msg, max_tokens=12, stream=True))
        assert chunks and all(ch.usage is None for ch in chunks)
        whole = c.sdk.chat.completions.create(model=MODEL, messages=msg, max_tokens=7)
        assert whole.usage is not None and whole.usage.completion_tokens == 7

        def delta() -> tuple[Counts, Counts, Counts]:
            front, (box, eng) = _front_billed(f), _boxes(f)
            return ((front[0] - front0[0], front[1] - front0[1]), (box[0] - box0[0], box[1] - box0[1]),
                    (eng[0] - eng0[0], eng[1] - eng0[1]))

        def settled() -> bool:  # the front = the boxes; the engines' prompts too, and their completion tokens but
            # those counted after each of the 4 hang-ups' EOF and never written (as real vLLM: docs/gateway.md "Usage")
            front, box, eng = delta()
            return front == box and box[0] == eng[0] and 0 <= eng[1] - box[1] <= unsent(100.0, 4)

        try:
            wait_for(settled, 15, "the front's and the boxes' counts equal, the engines' within the unsent tokens")
        except AssertionError:
            raise AssertionError(f"(prompt, completion): front {delta()[0]}, boxes (fleet key) {delta()[1]}, "
                                 f"engines {delta()[2]}") from None
        front, _, eng = delta()
        print(f"billed at the front {front} = the boxes; the engines counted {eng}")
        assert eng[1] > 3 * 20 + 30 + 30 + 12 + 7  # the hung-up ones generated past what their clients read
    finally:
        for b in f.boxes:
            b.command("canary 30", "canary")


def faulted(f: Fleet, c: Client, on: Callable[[], object], off: Callable[[], object], hold_s: float = 8.0,
            ) -> tuple[list[Result], float]:
    mark = [0.0]

    def during() -> None:
        time.sleep(1.5)
        mark[0] = time.monotonic()
        on()
        time.sleep(hold_s)

    try:
        rs = loop(c, 10, 3, during)
    finally:
        off()
    return rs, mark[0]


def served_but_the_known_stall(rs: list[Result]) -> None:
    """Served, but for a stream that was on a box when it went (its error event after the front's 10 s bound): at
    most 1 in 20, and only the front's clear error event; no 5xx, no hang, no cut."""
    # 0 failed of 160, 152 and 153 (docs/fleet.md#the-fault-table); allowed: the lossy link's 1 in 20, each the front's
    # clear error event (a stream silent past its 10 s bound), and no request past its 30 s first-byte bound + a
    # handshake retried under the loss
    failed = [r for r in rs if not r.ok]
    assert rs and len(failed) <= max(1, len(rs) // 20), summary(rs)
    assert all("the box answering stopped" in r.error for r in failed), summary(rs)


def back_in_router(f: Fleet) -> None:
    wait_for(lambda: healthy_in_router(f) == 3, 30, "every box back in the router's rotation", interval=0.2)


def test_a_box_switching_profile_while_a_client_loops_is_left_out_and_hangs_nobody(fleet: tuple[Fleet, Client]) -> None:
    """The switching box drains (its answers finish) and leaves the router's rotation; the others serve: the issue's
    0 refused and 0 cut. Its last failure, the box's drain letting a request in as it ended, is fixed (the drain
    keeps the engine marked until its stop begins: docs/fleet.md "Not done yet"; 18 switches, 1,665 requests, 0
    failed after the fix)."""
    f, c = fleet
    rs = loop(c, 10, 3, lambda: f.boxes[0].command("switch balanced", "switched"))
    print(f"switch under a looping client: {summary(rs)}")
    assert len(rs) > 10
    assert all(r.ok for r in rs), summary(rs)
    # the 10 s silences once seen here (1 stream in ~100: the front's lost wakeup, fixed) are not allowed any more
    assert not any("nothing came from upstream" in r.error for r in rs), summary(rs)
    assert max(r.end - r.start for r in rs) <= 15, "a request hung during the switch"
    back_in_router(f)


def test_a_box_upgraded_to_a_candidate_build_while_a_client_loops_hangs_nobody(fleet: tuple[Fleet, Client]) -> None:
    """The box's owner builds the SIMULATED candidate `next` and promotes it (`engine build-image --commit next --demo`,
    `engine promote next`: simbox.py `upgrade`, the same calls); the promote's switch drains as a profile switch does,
    so the box leaves the router's rotation and the others serve: 0 refused, 0 cut, as a switch. Then rolled back the
    same way."""
    f, c = fleet
    b = f.boxes[0]
    for cmd, want in (("upgrade next", "next"), ("rollback", None)):
        done: dict[str, object] = {}
        rs = loop(c, 10, 3, lambda cmd=cmd, done=done: done.update(b.command(cmd, "upgraded")))
        print(f"{cmd} under a looping client: {done}; {summary(rs)}")
        assert done["ready"] and done["ok"] and done["upgraded"] == done["current"], done
        assert done["upgraded"] == want if want else done["upgraded"] != "next", done
        assert done["engine_sim_build"] == [want or ""], done  # the engine process runs that build, not only its label
        assert len(rs) > 10
        assert all(r.ok for r in rs), summary(rs)
        assert max(r.end - r.start for r in rs) <= 15, f"a request hung during the {cmd}"
        back_in_router(f)


def test_a_cut_link_is_served_by_the_other_boxes_and_its_streams_end_with_an_error(fleet: tuple[Fleet, Client]) -> None:
    f, c = fleet
    b = f.boxes[1]
    rs, cut = faulted(f, c, lambda: f.link(b, False), lambda: f.link(b, True))
    after = [r for r in rs if r.start >= cut + 3]
    served_but_the_known_stall(after)  # the others serve
    assert longest_gap(rs, cut) <= 12, longest_gap(rs, cut)  # bench/fleet prints the figure (goal ≤ 5 s)
    assert max(r.end - r.start for r in rs) <= 15, "a request hung on the cut box"
    back_in_router(f)


def test_a_frozen_gateway_is_left_out_and_nothing_hangs(fleet: tuple[Fleet, Client]) -> None:
    f, c = fleet
    b = f.boxes[2]
    rs, mark = faulted(f, c, lambda: f.freeze(b, True), lambda: f.freeze(b, False))
    after = [r for r in rs if r.start >= mark + 3]
    served_but_the_known_stall(after)
    assert max(r.end - r.start for r in rs) <= 15, "a request hung on the frozen box"
    back_in_router(f)


def test_a_lossy_link_slows_nothing_into_a_hang(fleet: tuple[Fleet, Client]) -> None:
    f, c = fleet
    applied: list[str] = []
    rs, _ = faulted(f, c, lambda: applied.append(f.netem(f.boxes[1], True)), lambda: f.netem(f.boxes[1], False))
    print(f"lossy link: {applied[0]}; {summary(rs)}")
    served_but_the_known_stall(rs)  # 0 of 2,058 failed in nine runs (docs/fleet.md#the-fault-table)
    # a hang is past the front's bounds (30 s before a first byte, 10 s mid-answer): under 20 % loss each way a new
    # connection to the box can wait 1+2+4+8 s for its handshake (seen once: a request served after > 15 s)
    slowest = sorted(round(r.end - r.start, 1) for r in rs)[-5:]
    assert slowest[-1] <= 35, f"a request hung on the lossy link: the slowest {slowest} s"
    back_in_router(f)


def test_a_slow_lossy_link_hangs_nothing_and_fails_only_with_the_clear_error(fleet: tuple[Fleet, Client]) -> None:
    """300 ms each way and 20 % loss each way on one box's link (netem where the kernel has it; here the box's relay,
    in the path of every connection to its gateway since the start, delays each chunk, and nftables drops; Fleet.
    slow_link). Requests on that box are slower; nothing may hang past the front's bounds, and a failure may only be
    the front's clear error event."""
    f, c = fleet
    b = f.boxes[1]
    applied: list[str] = []
    rs, _ = faulted(f, c, lambda: applied.append(f.slow_link(b, True)), lambda: f.slow_link(b, False), hold_s=12)
    slowest = sorted(round(r.end - r.start, 1) for r in rs)[-5:]
    print(f"slow lossy link: {applied[0]}; relayed {b.relayed}; {summary(rs)}; the slowest {slowest} s")
    if not applied[0].startswith("netem"):
        assert b.relayed["connections"] > 0 and b.relayed["bytes_out"] > 0, b.relayed  # the delay was on the path
    # 0 failed of 160, 152 and 153 (docs/fleet.md#the-fault-table); allowed: the lossy link's 1 in 20, each the front's
    # clear error event (a stream silent past its 10 s bound), and no request past its 30 s first-byte bound + a
    # handshake retried under the loss
    failed = [r for r in rs if not r.ok]
    assert rs and len(failed) <= max(1, len(rs) // 20), summary(rs)
    assert all("the box answering stopped" in r.error or "nothing came from upstream" in r.error for r in failed), \
        summary(rs)
    assert slowest[-1] <= 35, f"a request hung on the slow link: the slowest {slowest} s"
    back_in_router(f)


def test_the_panel_as_front_supervises_the_router_and_serves_again_after_it_is_killed(
        fleet: tuple[Fleet, Client]) -> None:
    """The front as the panel runs it (a fleet file in its state dir: it starts vllm-router; its gateway process is
    the front); the router killed: the panel starts it again and the front serves."""
    import os
    import signal

    f, c = fleet
    f.start_panel_front()
    wait_for(lambda: c.ask(4).ok, 90, "the panel's gateway serving as the fleet's front", interval=0.5)
    log = f.tmp / "front" / ".moet-panel" / "panel.log"
    assert "action=router_started who=panel" in log.read_text()
    pid = f.router_pid()
    # its title, once serving: "vllm::router" (setproctitle)
    assert pid is not None and "router" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
    os.kill(pid, signal.SIGKILL)
    t = time.monotonic()
    wait_for(lambda: f.router_pid() != pid and c.ask(4).ok, 30, "the front serving again after the router was killed",
             interval=0.1)
    print(f"router killed: serving again after {time.monotonic() - t:.2f} s")
    text = log.read_text()
    assert "action=router_exited" in text and "action=router_restarted" in text, text[-2000:]


def test_the_namespaces_are_this_runs_own(fleet: tuple[Fleet, Client]) -> None:
    f, _ = fleet
    assert all(b.ns.startswith(f.tag) for b in f.boxes) and Path(f"/run/netns/{f.front_ns}").exists()
