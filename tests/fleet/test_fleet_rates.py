"""tok/s per box on the Fleet tab (docs/fleet.md#one-dashboard): the rate of a box's gateway's completion-token
counter between the front's scrapes of its /metrics, as Prometheus' rate() (app/backend/fleet/boxes.py)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from app.backend.fleet.boxes import CounterRate, RateBook, generated_tokens
from app.backend.gateway.gwmetrics import GatewayMetrics, families


def test_the_first_scrape_gives_no_rate_the_second_gives_the_increase_over_the_time_between() -> None:
    r = CounterRate(window_s=10)
    assert r.add(100.0, 500.0) is None  # one scrape: nothing to divide
    assert r.add(102.0, 600.0) == pytest.approx(50.0)
    assert r.add(104.0, 600.0) == pytest.approx(25.0)  # 100 tokens over the 4 s the window spans


def test_the_window_keeps_about_window_s_of_scrapes() -> None:
    r = CounterRate(window_s=6)
    for i in range(10):  # 40 tok/s for 18 s, then nothing
        r.add(100.0 + 2 * i, 80.0 * i)
    assert r.rate() == pytest.approx(40.0)
    r.add(120.0, 720.0)
    r.add(122.0, 720.0)
    r.add(124.0, 720.0)
    assert r.rate() == pytest.approx(0.0)  # the window has left the busy seconds: no memory of them


def test_a_counter_reset_counts_from_zero_never_a_negative_rate() -> None:
    r = CounterRate(window_s=10)
    r.add(0.0, 1000.0)
    r.add(2.0, 1100.0)  # +100
    got = r.add(4.0, 60.0)  # the box's gateway restarted: 60 since its start
    assert got == pytest.approx((100.0 + 60.0) / 4.0)
    assert r.add(6.0, 100.0) == pytest.approx((100.0 + 60.0 + 40.0) / 6.0)


def test_a_box_that_stops_answering_has_no_rate_and_starts_again_from_a_new_pair() -> None:
    r = CounterRate(window_s=10)
    r.add(0.0, 0.0)
    assert r.add(2.0, 100.0) == pytest.approx(50.0)
    assert r.add(4.0, None) is None  # no answer: not known (not 0, not the last figure)
    assert r.rate() is None
    assert r.add(6.0, 5000.0) is None  # back: a first scrape again (what it did meanwhile is not spread over it)
    assert r.add(8.0, 5010.0) == pytest.approx(5.0)


def test_a_clock_that_did_not_move_divides_by_nothing() -> None:
    r = CounterRate()
    assert r.add(5.0, 10.0) is None
    assert r.add(5.0, 20.0) is None


def test_the_book_keeps_one_rate_per_box_and_forgets_boxes_removed() -> None:
    book = RateBook(window_s=10)
    book.add("a", 0.0, 0.0)
    book.add("b", 0.0, 0.0)
    assert book.add("a", 2.0, 20.0) == pytest.approx(10.0)
    assert book.add("b", 2.0, 200.0) == pytest.approx(100.0)
    book.keep(["a"])
    assert book.add("b", 4.0, 300.0) is None  # removed then added again: a first scrape
    assert book.add("a", 4.0, 40.0) == pytest.approx(10.0)


class _Gateway(Collector):
    def __init__(self, metrics: GatewayMetrics | None, running: bool = True) -> None:
        self.metrics, self.running = metrics, running

    def collect(self) -> Iterator[object]:  # type: ignore[override]
        yield from families(self.metrics.as_json() if self.metrics else None, self.running)


def _samples(collector: Collector) -> list[tuple[str, dict[str, str], float]]:
    """The panel's own export of its gateway's series, as text, read back as the front reads a box's /metrics."""
    reg = CollectorRegistry()
    reg.register(collector)
    text = generate_latest(reg).decode()
    return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]


def test_generated_tokens_sums_the_completion_tokens_of_every_key_from_the_panels_export() -> None:
    m = GatewayMetrics()
    m.billed("front", prompt=900, completion=120)
    m.billed("front", prompt=10, completion=30)
    m.billed("panel-chat", prompt=5, completion=7)
    assert generated_tokens(_samples(_Gateway(m))) == 157.0  # prompt tokens are not generated ones
    assert generated_tokens(_samples(_Gateway(None))) == 0.0  # a gateway that never reported: 0, a known figure
    assert generated_tokens([("moet_panel_gpu_memory_used_bytes", {"gpu": "0"}, 1.0)]) is None  # no gateway series


def test_the_fleet_tab_shows_each_boxs_tok_s_and_a_down_box_as_down_with_no_rate() -> None:
    from app.backend.fleet.boxes import BoxStatus
    from app.backend.fleet.service import BoxFigures, BoxView, FleetView
    from app.ui.fleet import fleet_html

    page = fleet_html(FleetView((
        BoxView(BoxStatus("b1", True, True, "m", 1, "ready"), True, BoxFigures(("quality",), simulated=True), 48.7),
        BoxView(BoxStatus("b2", True, True, "m", 1, "ready"), True, BoxFigures(("quality",)), 3.25),
        BoxView(BoxStatus("b3", False, error="does not answer"), False, BoxFigures(error="its /metrics: ConnectError"),
                None)), router_pid=7, asked=True))
    rows = {r.split("'")[0]: r for r in page.split("<tr data-box='")[1:]}
    assert "data-col='tok-s' class='num'>49<" in rows["b1"] and "SIMULATED" in rows["b1"]
    assert "data-col='tok-s' class='num'>3.2<" in rows["b2"] and "SIMULATED" not in rows["b2"]
    assert ">down<small class='moet-fleet-why'>does not answer</small>" in rows["b3"]
    assert "data-col='tok-s' class='num'>—<" in rows["b3"] and "ConnectError" not in rows["b3"]  # said once: down
    assert "unhealthy" in rows["b3"]


def test_the_fleet_tab_says_it_is_asking_before_the_first_answers_and_no_boxes_after() -> None:
    from app.backend.fleet.service import FleetView
    from app.ui.fleet import fleet_html

    assert "Asking the boxes" in fleet_html(FleetView())  # the panel's first seconds: not "no boxes"
    assert "No boxes yet" in fleet_html(FleetView(asked=True))


class FrozenBox:
    """A box whose gateway and panel accept connections and never answer (SIGSTOPped); `peak` is the most
    connections it saw open at once (each counted until its client closes it)."""

    def __init__(self, peak: list[int], lock: threading.Lock) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self._peak, self._lock, self._open = peak, lock, [0]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._held, args=(conn,), daemon=True).start()

    def _held(self, conn: socket.socket) -> None:
        with self._lock:
            self._peak[1] += 1  # open now, over every box
            self._peak[0] = max(self._peak[0], self._peak[1])
        try:
            while conn.recv(65536):  # the request, then nothing: until the client gives up and closes
                pass
        except OSError:
            pass
        with self._lock:
            self._peak[1] -= 1

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


def test_the_fleet_view_asks_every_box_at_once_so_a_frozen_box_bounds_a_refresh_once(tmp_path) -> None:
    """A frozen box used to cost its status timeout and then its /metrics timeout (1.5 s each) before the next box
    was asked; now every box's status and /metrics are asked together: three frozen boxes see six connections open
    at once (asked in turn, never more than one)."""
    from app.backend.fleet import fleetfile
    from app.backend.fleet.service import FleetFront

    peak, lock = [0, 0], threading.Lock()
    frozen = [FrozenBox(peak, lock) for _ in range(3)]
    front = FleetFront(tmp_path)
    try:
        cfg = fleetfile.FleetConfig("k", tuple(fleetfile.Box(f"b{i}", f"http://127.0.0.1:{f.port}",
                                                             f"http://127.0.0.1:{f.port}/metrics")
                                               for i, f in enumerate(frozen)))
        view = front.refresh(cfg, {})
        assert [(v.box.reachable, bool(v.figures.error)) for v in view.boxes] == [(False, True)] * 3
        assert peak[0] == 6
    finally:
        front.close()
        for f in frozen:
            f.close()
