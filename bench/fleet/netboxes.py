"""Several SIMULATED boxes on one Linux machine, each in its own network namespace (tests/fleet, bench/fleet/run.py).

    with Fleet(n=3) as f:      # namespaces, veth pairs, the boxes, the front (router + gateway), all of this run
        f.enter_front()         # this thread (and what it starts) now lives in the front's namespace
        ...

Topology (addresses in 10.R.0.0/16, R chosen per run, used only inside these namespaces): the front's namespace F
holds one veth end per box (10.R.i.1/30); box i's namespace holds the other end, `eth0` (10.R.i.2/30), where its
gateway listens. The front (`moet-panel fleet serve`: the router on F's loopback and the gateway) runs in F, and
the caller's client with it (`enter_front`: setns(2) of the calling thread). Faults act on a box's `eth0`
(`ip link set down`, `tc netem`; without netem, nftables' loss and the delay of a relay, `slow_link`) or its
processes (SIGSTOP, a profile switch, an upgrade to a candidate build: simbox.py's commands).
`Fleet(metrics=True)`: each box also serves its panel's `/metrics` on 10.R.i.2:7860 behind a token of its own, given
to `fleet add --metrics-url --metrics-token` (bench/fleet/boxmetrics.py; the fleet's Prometheus,
tests/fleet/test_fleet_prometheus.py). `close()` kills every process of these namespaces (`ip netns pids`: only
ours), deletes them (their veths go with them) and the data dirs, even after a failure.
Root is needed; without it, or without `ip`, `NamespacesUnavailable` says so.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[2]
CLONE_NEWNET = 0x40000000
BOX_PORT = 8001
METRICS_PORT = 7860  # a box's panel /metrics (Fleet(metrics=True)), the panel's default port
FRONT_PORT = 8001
RELAY_PORT = 8002  # a box's slow-link relay (slow_link), in its namespace


class NamespacesUnavailable(RuntimeError):
    pass


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(list(args), capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {r.stderr.strip() or r.stdout.strip()}")
    return r


def setns(path: str) -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


def recipe_copy(tmp: Path, rid: str, decode_tok_s: float | None = None) -> Path:
    text = (ROOT / "assets" / "recipes" / "simulated.toml").read_text()
    text = text.replace('id = "simulated"', f'id = "{rid}"', 1).replace('MOET_SIM_BOOT_S = "4"', 'MOET_SIM_BOOT_S = "1"')
    if decode_tok_s is not None:
        text = text.replace("[serve.env]\n", f'[serve.env]\nMOET_SIM_DECODE_TOK_S = "{decode_tok_s:g}"\n', 1)
    p = tmp / "recipe.toml"
    p.write_text(text)
    return p


@dataclass
class Box:
    name: str
    ns: str
    addr: str
    data: Path
    proc: subprocess.Popen[str] | None = None
    lines: list[dict[str, Any]] = field(default_factory=list)
    relay: subprocess.Popen[str] | None = None  # its slow-link relay (Fleet.slow_link), while on
    relayed: dict[str, int] = field(default_factory=dict)  # what the last relay carried (connections, bytes)
    metrics_token: str = ""  # its /metrics bearer token (Fleet(metrics=True)); "" when it serves none

    @property
    def url(self) -> str:
        return f"http://{self.addr}:{BOX_PORT}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.addr}:{METRICS_PORT}/metrics"

    def command(self, line: str, want: str, timeout_s: float = 200.0) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return read_until(self.proc.stdout, want, timeout_s, self.name)

    def pids(self) -> list[int]:
        out = sh("ip", "netns", "pids", self.ns, check=False).stdout.split()
        return [int(p) for p in out]


def read_until(stream: IO[str], key: str, timeout_s: float, who: str) -> dict[str, Any]:
    import select

    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        ready, _, _ = select.select([stream], [], [], max(0.05, end - time.monotonic()))
        if not ready:
            continue
        line = stream.readline()
        if not line:
            raise RuntimeError(f"{who} ended before saying {key!r}")
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if "error" in d:
            raise RuntimeError(f"{who}: {d['error']}")
        if key in d:
            return dict(d)
    raise TimeoutError(f"{who} did not say {key!r} within {timeout_s:.0f} s")


class Fleet:
    def __init__(self, n: int = 3, decode_tok_s: float | None = None, name: str = "", metrics: bool = False,
                 relays: bool = False) -> None:
        self.n = n
        self.relays = relays  # each box's gateway port behind its slow-link relay (start_relay), for slow_link
        self.metrics = metrics  # each box serves its panel's /metrics too (boxmetrics.py)
        self.tag = name or f"mpf{os.getpid() % 100000}"
        self.r = 100 + os.getpid() % 100  # 10.R.0.0/16: this run's test range
        self.front_ns = f"{self.tag}-f"
        self.tmp = Path.home() / f"moet-fleet-{self.tag}-{int(time.time())}"
        self.decode_tok_s = decode_tok_s
        self.boxes: list[Box] = []
        self.front: subprocess.Popen[str] | None = None
        self.front_url = ""
        self._root_ns = os.open("/proc/self/ns/net", os.O_RDONLY)
        self._made: list[str] = []
        self.recipe: Path | None = None

    # -- set-up ------------------------------------------------------------------------------------
    def __enter__(self) -> Fleet:
        try:
            self.build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _netns(self, ns: str) -> None:
        sh("ip", "netns", "add", ns)
        self._made.append(ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")

    def build(self) -> None:
        if os.geteuid() != 0 or shutil.which("ip") is None:
            raise NamespacesUnavailable("the fleet tests need root and iproute2 (`ip netns`) to create network "
                                        f"namespaces; euid={os.geteuid()}, ip={shutil.which('ip')}")
        try:
            self._netns(self.front_ns)
        except RuntimeError as exc:
            raise NamespacesUnavailable(f"cannot create a network namespace on this machine ({exc}); the fleet "
                                        "tests need `ip netns add` (root, CAP_SYS_ADMIN)") from exc
        self.tmp.mkdir(parents=True)
        self.recipe = recipe_copy(self.tmp, f"fleet-{self.tag}", self.decode_tok_s)
        for i in range(1, self.n + 1):
            ns = f"{self.tag}-b{i}"
            self._netns(ns)
            a, b = f"{self.tag}a{i}", f"{self.tag}b{i}"
            sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
            sh("ip", "link", "set", a, "netns", self.front_ns)
            sh("ip", "link", "set", b, "netns", ns)
            sh("ip", "-n", ns, "link", "set", b, "name", "eth0")
            sh("ip", "-n", self.front_ns, "addr", "add", f"10.{self.r}.{i}.1/30", "dev", a)
            sh("ip", "-n", ns, "addr", "add", f"10.{self.r}.{i}.2/30", "dev", "eth0")
            sh("ip", "-n", self.front_ns, "link", "set", a, "up")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            self.boxes.append(Box(f"box{i}", ns, f"10.{self.r}.{i}.2", self.tmp / f"box{i}"))

    def env(self, data: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MOET_PANEL_", "GRADIO_"))}
        env.update(PYTHONPATH=str(ROOT), XDG_DATA_HOME=str(data / "share"), MOET_PANEL_GPU="simulated")
        return env

    def cli(self, *args: str, data: Path | None = None, input: str | None = None,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        """`moet-panel ARGS` on the front's data dir, in the front's namespace."""
        data = data or self.tmp / "front"
        argv = ["ip", "netns", "exec", self.front_ns, sys.executable, "-m", "app.cli.main", *args,
                "--demo", "--recipe", str(self.recipe), "--data-dir", str(data)]
        r = subprocess.run(argv, cwd=ROOT, env=self.env(data), capture_output=True, text=True, input=input, timeout=120)
        if check and r.returncode != 0:
            raise RuntimeError(f"moet-panel {' '.join(args)}: rc {r.returncode}: {r.stderr.strip()}")
        return r

    def start_box(self, box: Box, fleet_key: str, profile: str = "quality") -> None:
        box.data.mkdir(parents=True, exist_ok=True)
        assert self.recipe is not None
        box.proc = subprocess.Popen(
            ["ip", "netns", "exec", box.ns, sys.executable, "-m", "bench.fleet.simbox", "--data", str(box.data),
             "--host", box.addr, "--port", str(BOX_PORT), "--recipe", str(self.recipe), "--profile", profile,
             *self._metrics_argv(box)],
            cwd=ROOT, env=self.env(box.data), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=open(box.data / "simbox.err", "w"), text=True, start_new_session=True)
        if self.relays and box.relay is None:
            self.start_relay(box)
        assert box.proc.stdin is not None
        box.proc.stdin.write(fleet_key + "\n")
        box.proc.stdin.flush()

    def start(self, boxes: int | None = None) -> str:
        """The fleet file and its key, the boxes, `fleet add` of each, the front. Returns the fleet key."""
        key = self.cli("fleet", "init", "--router-port", "30100", "--router-metrics-port", "29100").stdout.strip()
        todo = self.boxes[: boxes or self.n]
        for b in todo:
            self.start_box(b, key)
        for b in todo:
            assert b.proc is not None and b.proc.stdout is not None
            d = read_until(b.proc.stdout, "ready", 240, b.name)
            if not d["ready"]:
                raise RuntimeError(f"{b.name}'s engine did not become ready: {(b.data / 'simbox.err').read_text()[-2000:]}")
        for b in todo:
            self.cli("fleet", "add", b.name, b.url,
                     *(("--metrics-url", b.metrics_url, "--metrics-token", b.metrics_token) if b.metrics_token else ()))
        self.start_front()
        return key

    def _metrics_argv(self, box: Box) -> list[str]:
        """simbox's flags for its /metrics: a new token in a 0600 file of the box's data dir (as the panel's
        --metrics-token-file), kept on `box` for the fleet file."""
        if not self.metrics:
            return []
        import secrets

        box.metrics_token = box.metrics_token or secrets.token_hex(32)
        f = box.data / "metrics.token"
        fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(box.metrics_token + "\n")
        return ["--metrics-port", str(METRICS_PORT), "--metrics-token-file", str(f)]

    def start_front(self) -> None:
        data = self.tmp / "front"
        assert self.recipe is not None
        self.front = subprocess.Popen(
            ["ip", "netns", "exec", self.front_ns, sys.executable, "-m", "app.cli.main", "fleet", "serve",
             "--port", str(FRONT_PORT), "--rate", "100000", "--max-concurrent", "64",  # the bench is one key
             "--demo", "--recipe", str(self.recipe), "--data-dir", str(data)],
            cwd=ROOT, env=self.env(data), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=open(self.tmp / "front.err", "w"), text=True, start_new_session=True)
        assert self.front.stdout is not None
        d = read_until(self.front.stdout, "listening", 60, "the front")
        self.front_url = str(d["listening"])
        read_until(self.front.stdout, "serving", 120, "the front")

    def start_panel_front(self) -> None:
        """The front as the panel runs it: `fleet serve` stopped, then `moet-panel serve --demo` on the same data dir
        with its gateway switch left on (gateway.json): the panel supervises the router (a fleet file is there) and
        its gateway process is the front. Its log: <tmp>/panel-front.log."""
        import json as _json

        if self.front is not None:
            self.front.terminate()
            self.front.wait(15)
        data = self.tmp / "front"
        (data / ".moet-panel" / "gateway.json").write_text(_json.dumps({"on": True, "port": FRONT_PORT}))
        assert self.recipe is not None
        log = open(self.tmp / "panel-front.log", "w")
        env = {**self.env(data), "MOET_PANEL_GATEWAY_HOST": "127.0.0.1"}
        self.front = subprocess.Popen(
            ["ip", "netns", "exec", self.front_ns, sys.executable, "-m", "app.cli.main", "serve", "--port", "7860",
             "--demo", "--recipe", str(self.recipe), "--data-dir", str(data)],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, text=True,
            start_new_session=True)
        end = time.monotonic() + 120
        while "moet-panel is running" not in (self.tmp / "panel-front.log").read_text():
            if self.front.poll() is not None or time.monotonic() > end:
                raise RuntimeError("the front's panel did not start:\n" + (self.tmp / "panel-front.log").read_text()[-3000:])
            time.sleep(0.2)
        self.front_url = f"http://127.0.0.1:{FRONT_PORT}"

    def enter_front(self) -> None:
        """This thread (and the threads and processes it starts from now on) in the front's namespace."""
        setns(f"/run/netns/{self.front_ns}")

    def leave(self) -> None:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.setns(self._root_ns, CLONE_NEWNET)

    def router_pid(self) -> int | None:
        """The router the front runs now: the pid of the operator's log's last router_started/_restarted line."""
        import re

        log = self.tmp / "front" / ".moet-panel" / "panel.log"
        found = re.findall(r"action=router_(?:started|restarted) \S+ pid=(\d+)", log.read_text() if log.exists() else "")
        return int(found[-1]) if found else None

    def front_pids(self, needle: str) -> list[int]:
        """The front's descendants whose command line holds `needle` (the router: the supervisor's child)."""
        import psutil

        if self.front is None:
            return []
        out = []
        for child in psutil.Process(self.front.pid).children(recursive=True):
            try:
                if needle in " ".join(child.cmdline()):
                    out.append(child.pid)
            except psutil.Error:
                continue
        return out

    # -- faults ------------------------------------------------------------------------------------
    def link(self, box: Box, up: bool) -> None:
        sh("ip", "-n", box.ns, "link", "set", "eth0", "up" if up else "down")

    def netem(self, box: Box, on: bool) -> str:
        """A slow, lossy link on the box's eth0: netem 300 ms delay and 20 % loss; on a kernel without sch_netem
        (this machine's: "Specified qdisc kind is unknown"), 20 % loss each way by nftables' random drop and no
        delay. Returns what was applied."""
        if not on:
            sh("ip", "netns", "exec", box.ns, "tc", "qdisc", "del", "dev", "eth0", "root", check=False)
            sh("ip", "netns", "exec", box.ns, "nft", "delete", "table", "inet", "mpfloss", check=False)
            return ""
        r = sh("ip", "netns", "exec", box.ns, "tc", "qdisc", "add", "dev", "eth0", "root", "netem",
               "delay", "300ms", "loss", "20%", check=False)
        if r.returncode == 0:
            return "netem delay 300ms loss 20%"
        if "unknown" not in r.stderr:
            raise RuntimeError(f"tc netem: {r.stderr.strip()}")
        nft = ["ip", "netns", "exec", box.ns, "nft"]
        sh(*nft, "add", "table", "inet", "mpfloss")
        for hook in ("input", "output"):
            sh(*nft, "add", "chain", "inet", "mpfloss", hook, f"{{ type filter hook {hook} priority 0; }}")
            sh(*nft, "add", "rule", "inet", "mpfloss", hook, "oifname" if hook == "output" else "iifname", "eth0",
               "numgen", "random", "mod", "100", "<", "20", "drop")
        return "loss 20% each way (nftables; this kernel has no netem: no delay)"

    def start_relay(self, box: Box) -> None:
        """The box's slow-link relay (bench/fleet/slowlink.py, delay 0) in its namespace, and every new connection to
        its gateway's port from eth0 redirected to it (nftables nat): in the path from before `fleet add`, so a delay
        set later acts on every connection (the router's pooled ones too), as netem's would. The fleet file, the
        router and the gateway are untouched; the box's own loopback goes direct."""
        box.relay = subprocess.Popen(
            ["ip", "netns", "exec", box.ns, sys.executable, "-m", "bench.fleet.slowlink", "--listen",
             f"{box.addr}:{RELAY_PORT}", "--to", f"{box.addr}:{BOX_PORT}"],
            cwd=ROOT, env=self.env(box.data), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=open(box.data / "slowlink.err", "w"), text=True, start_new_session=True)
        assert box.relay.stdout is not None
        read_until(box.relay.stdout, "relaying", 30, f"{box.name}'s relay")
        nft = ["ip", "netns", "exec", box.ns, "nft"]
        sh(*nft, "add", "table", "ip", "mpfslow")
        sh(*nft, "add", "chain", "ip", "mpfslow", "pre", "{ type nat hook prerouting priority -100; }")
        sh(*nft, "add", "rule", "ip", "mpfslow", "pre", "iifname", "eth0", "tcp", "dport", str(BOX_PORT),
           "redirect", "to", f":{RELAY_PORT}")

    def slow_link(self, box: Box, on: bool, delay_ms: float = 300.0) -> str:
        """A slow, lossy link: netem's delay and loss where the kernel has netem (`netem`); without it, the loss by
        nftables and the delay by the box's relay (`Fleet(relays=True)`). Off: what the relay carried meanwhile is in
        `box.relayed`. Returns what was applied."""
        if not on:
            if box.relay is not None:
                box.relayed = dict(self._relay_delay(box, 0)["relayed"])
            return self.netem(box, False)
        applied = self.netem(box, True)
        if applied.startswith("netem"):
            return applied
        if box.relay is None:
            raise RuntimeError("no netem on this kernel, and the box has no relay for the delay: Fleet(relays=True)")
        self._relay_delay(box, delay_ms)
        return (f"{delay_ms:g} ms each way by a userspace TCP relay (per chunk of the byte stream; no netem on this "
                "kernel) + loss 20% each way (nftables)")

    def _relay_delay(self, box: Box, delay_ms: float) -> dict[str, Any]:
        assert box.relay is not None and box.relay.stdin is not None and box.relay.stdout is not None
        box.relay.stdin.write(f"delay {delay_ms:g}\n")
        box.relay.stdin.flush()
        return read_until(box.relay.stdout, "delay_ms", 10, f"{box.name}'s relay")

    def freeze(self, box: Box, frozen: bool) -> None:
        assert box.proc is not None
        os.kill(box.proc.pid, signal.SIGSTOP if frozen else signal.SIGCONT)

    # -- tear-down ---------------------------------------------------------------------------------
    def close(self) -> None:
        try:
            self.leave()
        except OSError:
            pass
        for ns in reversed(self._made):
            for sig in (signal.SIGCONT, signal.SIGKILL):
                for p in sh("ip", "netns", "pids", ns, check=False).stdout.split():
                    try:
                        os.kill(int(p), sig)
                    except ProcessLookupError:
                        pass
        for proc in [b.proc for b in self.boxes] + [b.relay for b in self.boxes] + [self.front]:
            if proc is not None:
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    pass
        for ns in reversed(self._made):
            sh("ip", "netns", "del", ns, check=False)
        self._made.clear()
        shutil.rmtree(self.tmp, ignore_errors=True)
