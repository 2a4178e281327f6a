"""The chaos soak (issue 39, item 7): a seeded random sequence of faults against a demo panel on the real Docker
with the SIMULATED engine; per fault kind, was serving restored, how fast, and did the panel fight what it
must not.

    .venv/bin/python -m bench.chaos [--cycles 200] [--seed 1] [--short]     # nice -n 10 on a shared box

The panel is `moet-panel serve --demo` as a child process (bench/chaos/panel_main.py: the panel's own CLI with
the restart cap's window shortened to --restart-window-s, see there) on a copy of the SIMULATED recipe (its own
id, port and data dir under ~/moet-chaos-<pid>/, canary every 2 s), its gateway switched on, reaching Docker
only through the chaos proxy (bench/chaos/docker_proxy.py) as DOCKER_HOST; the CLI calls of the soak
(`engine start/stop/switch`, `keys create`, `engine status --json`) go through it too. Serving means: a
1-token chat completion through the panel's gateway with a key answers 200.

Faults (the table with what each one does: docs/engine.md, "Chaos soak"); the time back to serving counts from
when the fault clears:

* engine kill — `docker kill`; clears at once; expected: restarted.
* panel kill -9 — SIGKILL the panel, then its process group (as systemd does), start a new panel; clears when
  the new panel runs; expected: serving again.
* docker away — the proxy cut, the engine `docker stop`ped meanwhile (a daemon restart stops its containers),
  restored after N s; clears when restored; expected: brought back (not a person's stop).
* port held — `docker kill`, its port (or unix socket path) held N s; clears when released; expected: restarted.
* hang — `docker kill -s USR1` (the SIMULATED engine wedges); clears at once; expected: the canary finds it, restarted.
* disk full — the data dir (a tmpfs) filled to the last byte and the engine killed meanwhile, freed after N s;
  clears when freed; expected: restarted.
* switch mid-stream — a chat streams through the gateway with a key while `engine switch` runs; counts from
  the switch; expected: the answer finishes whole, then serving on the new profile.
* outside stop — a clean `docker stop`; expected: respected, nothing started within --observe-s.
* non-healing — `engine start` of a custom profile failing with CUDA OOM at load; expected: not retried.

After a fault the soak waits up to --restore-timeout-s for serving; if it is not back, or after the last two
kinds, a person's `engine start` brings it back for the next cycle. Prints one line per cycle and the table:
per kind cycles, restored, time back to serving p50/p95, gave up, restarts of non-healing failures, outside
stops fought, answers cut. Exit 1 when a robust outcome failed (a healing fault not restored, a non-healing
failure restarted, an outside stop fought, an answer cut by the switch).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

from bench.chaos.docker_proxy import DockerProxy  # noqa: E402
from bench.panelproc import free_port, panel_env, recipe_copy  # noqa: E402

HEALING = ("engine kill", "panel kill -9", "docker away", "port held", "hang", "disk full", "switch mid-stream")
NOT_HEALING = ("outside stop", "non-healing")
KINDS = HEALING + NOT_HEALING
WEIGHTS = {"engine kill": 3, "panel kill -9": 2, "docker away": 2, "port held": 2, "hang": 2, "disk full": 1,
           "switch mid-stream": 2, "outside stop": 1, "non-healing": 1}
PROFILES = ("quality", "balanced", "speed")
MODEL = "deepseek-v4-flash"
OOM_PROFILE = "chaos-oom"


def schedule(cycles: int, seed: int) -> list[str]:
    """The fault sequence: every kind once first (a seeded order, so a short run covers all), then weighted draws."""
    rng = random.Random(seed)
    first = list(KINDS)
    rng.shuffle(first)
    rest = rng.choices(list(KINDS), [WEIGHTS[k] for k in KINDS], k=max(0, cycles - len(first)))
    return (first + rest)[:cycles]


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


@dataclass
class KindStats:
    cycles: int = 0
    restored: int = 0
    back_s: list[float] = field(default_factory=list)
    gave_up: int = 0
    not_restored: list[str] = field(default_factory=list)
    non_healing_restarts: int = 0
    fought: int = 0
    cut: int = 0
    streams: int = 0
    persons: int = 0  # a person's start was needed afterwards (for a healing kind: it was not restored)


@dataclass
class Report:
    stats: dict[str, KindStats]
    wall_s: float
    notes: list[str]
    panel_restarts: int = 0
    secrets_in_logs: int = -1  # occurrences of a known secret in the panel's logs (-1: not scanned)
    decision_lines: int = 0  # operator-log lines with an action= (decisions)

    def healing_failures(self) -> list[str]:
        return [f"{k}: {w}" for k in HEALING for w in self.stats[k].not_restored]

    @property
    def non_healing_restarts(self) -> int:
        return sum(s.non_healing_restarts for s in self.stats.values())

    @property
    def fought(self) -> int:
        return sum(s.fought for s in self.stats.values())

    @property
    def answers_cut(self) -> int:
        return sum(s.cut for s in self.stats.values())

    @property
    def ok(self) -> bool:
        return not (self.healing_failures() or self.non_healing_restarts or self.fought or self.answers_cut
                    or self.secrets_in_logs > 0)

    def table(self) -> str:
        head = (f"{'fault kind':<18} {'cycles':>6} {'restored':>9} {'back p50':>9} {'back p95':>9} {'gave up':>8} "
                f"{'non-heal restarts':>17} {'stops fought':>12} {'answers cut':>11}")
        rows = [head, "-" * len(head)]
        for k in KINDS:
            s = self.stats[k]
            if not s.cycles:
                continue
            heal = k in HEALING
            rows.append(
                f"{k:<18} {s.cycles:>6} {(f'{s.restored}/{s.cycles}' if heal else '-'):>9} "
                f"{(f'{pct(s.back_s, 0.5):.1f} s' if heal and s.back_s else '-'):>9} "
                f"{(f'{pct(s.back_s, 0.95):.1f} s' if heal and s.back_s else '-'):>9} "
                f"{(str(s.gave_up) if heal else '-'):>8} "
                f"{(str(s.non_healing_restarts) if k == 'non-healing' else '-'):>17} "
                f"{(str(s.fought) if k == 'outside stop' else '-'):>12} "
                f"{(f'{s.cut}/{s.streams}' if s.streams else '-'):>11}")
        back = [b for k in HEALING for b in self.stats[k].back_s]
        cycles = sum(s.cycles for s in self.stats.values())
        heal_n = sum(self.stats[k].cycles for k in HEALING)
        restored = sum(self.stats[k].restored for k in HEALING)
        rows.append(f"all: {cycles} cycles in {self.wall_s:.0f} s; healing faults restored {restored}/{heal_n}; time "
                    f"back to serving p50 {pct(back, 0.5):.1f} s, p95 {pct(back, 0.95):.1f} s (goal <= 30 s); "
                    f"non-healing restarts {self.non_healing_restarts}, outside stops fought {self.fought}, "
                    f"answers cut {self.answers_cut} (goals 100 %, 0, 0, 0); the panel restarted by a person to "
                    f"serve again: {self.panel_restarts}")
        rows.append(f"operator log: {self.decision_lines} decision lines; known secrets (keys, notify URL password, "
                    f"HF token) in the panel's logs: {self.secrets_in_logs} (goal 0)")
        return "\n".join(rows)


@dataclass
class Options:
    cycles: int = 200
    seed: int = 1
    away_s: tuple[float, float] = (5.0, 20.0)  # Docker away, port held: N drawn from this range
    disk_s: tuple[float, float] = (8.0, 20.0)  # longer than the first backoff (5 s): the restart meets the full disk
    restore_timeout_s: float = 60.0
    observe_s: float = 9.0  # > the first backoff (5 s) + a boot: a restart would show
    restart_window_s: float = 10.0
    restart_backoff_s: float = 5.0  # the soak panel's first restart delay (5 s: the panel's own; short_form scales it)
    stream_tokens: int = 160
    verbose: bool = True
    progress_file: Path | None = None  # the table so far, rewritten after every cycle (a long run read early)


def short_form(cycles: int = len(KINDS), seed: int = 11) -> Options:
    """The CI form (tests/engine/test_chaos_soak.py, `--short`): every fault once, each on a shorter clock. The soak
    panel's restart backoff is 2 s (the panel's 5 s scaled down; the doubling and the classes stay the panel's) and
    its cap window 4 s with it; every fault still outlasts the first restart's backoff, so the restart meets Docker
    away, the port held, the full disk (5-6 s, 5 s); the outside stop and the non-healing start are watched 5 s,
    past the backoff and a 1 s boot, so a restart would show."""
    return Options(cycles=cycles, seed=seed, away_s=(5.0, 6.0), disk_s=(5.0, 5.0), restore_timeout_s=40.0, observe_s=5.0,
                   restart_window_s=4.0, restart_backoff_s=2.0)


class Chaos:
    """One soak: the proxy, the panel process, the keys, the fault injectors and the bookkeeping."""

    def __init__(self, opts: Options) -> None:
        import docker

        from app.backend.simengine.image import content_tag, ensure_image

        self.o = opts
        self.rng = random.Random(opts.seed * 7919 + 1)
        self.docker = docker.from_env(timeout=60)
        self.image = ensure_image(self.docker, tag=content_tag())
        self.home = Path.home() / f"moet-chaos-{os.getpid()}"
        self.home.mkdir(parents=True, exist_ok=True)
        self.data = self.home / "data"
        self.data.mkdir(exist_ok=True)
        self.notes: list[str] = []
        self.tmpfs = self._mount_tmpfs()
        self.recipe, self.rid = recipe_copy(ROOT, self.home, f"chaos-{os.getpid()}", boot_s="1")
        text = self.recipe.read_text().replace('image = "moet-panel/sim-engine:1"', f'image = "{self.image}"')
        text = text.replace("stop_grace_s = 10", "stop_grace_s = 5\ncanary_interval_s = 2\ncanary_timeout_s = 1")
        self.recipe.write_text(text)
        self.proxy = DockerProxy(self.home / "docker.sock").start()
        # known secrets the logs must never show (docs/engine.md, "Chaos soak"): the keys, a notify URL's password
        # (alerts go to a closed port), an HF token
        self.secrets = [f"chaospw{os.getpid()}x", f"hf_chaos{os.getpid()}TokenNeverLogged"]
        self.env = {**panel_env(ROOT, self.home), "DOCKER_HOST": self.proxy.url,
                    "MOET_PANEL_NOTIFY": f"json://chaos:{self.secrets[0]}@127.0.0.1:9/hook", "HF_TOKEN": self.secrets[1],
                    "MOET_CHAOS_RESTART_WINDOW_S": f"{opts.restart_window_s:g}",
                    "MOET_CHAOS_RESTART_BACKOFF_S": f"{opts.restart_backoff_s:g}", "MOET_SIM_REASONING_MODE": "none"}
        self.cli_base = [sys.executable, "-m", "app.cli.main", "--demo", "--recipe", str(self.recipe),
                         "--data-dir", str(self.data)]
        self.gw_port = free_port()
        self.gateway = f"http://127.0.0.1:{self.gw_port}"
        self.keys: list[str] = []
        self.key_i = 0
        self.panel: subprocess.Popen[bytes] | None = None
        self.panel_n = 0
        self.starts: list[tuple[float, str]] = []  # (monotonic, container id) of every start of this recipe's engine
        self._events: Any = None
        self.stats = {k: KindStats() for k in KINDS}
        self.profile = "quality"
        self.panel_restarts = 0  # a person had to restart the panel to get serving back
        import httpx

        self.http = httpx.Client(timeout=httpx.Timeout(10.0, connect=2.0))

    # -- set-up and tear-down ------------------------------------------------------------------------
    def _mount_tmpfs(self) -> bool:
        """The data dir on a 1.2 GiB tmpfs (preflight wants 1 GiB free; the disk-full fault fills it); needs root. Only what
        is written takes memory."""
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1200m,mode=0700", "tmpfs", str(self.data)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            self.notes.append(f"disk full: no tmpfs for the data dir ({r.stderr.strip() or 'mount failed'}); "
                              "that fault is left out")
            return False
        return True

    def setup(self) -> None:
        from app.backend.gateway.switch import DesiredGateway, save_desired

        state_dir = self.data / ".moet-panel"
        state_dir.mkdir(parents=True, exist_ok=True)
        for i in range(4):  # the gateway's default rate is 120 a minute per key: the probes take turns
            out = self.cli("keys", "create", f"chaos{i}", "--json", check=True)
            self.keys.append(json.loads(out.stdout)["key"])
        save_desired(state_dir, DesiredGateway(on=True, port=self.gw_port))  # the switch left on
        self._write_oom_profile()
        self._watch_starts()
        self.start_panel()
        r = self.cli("engine", "start", "--profile", self.profile, timeout=180)
        if r.returncode != 0:
            raise SystemExit(f"the first engine start failed: {r.stdout[-1500:]}{r.stderr[-1500:]}")
        if self.wait_serving(120) is None:
            raise SystemExit("not serving through the gateway after the first start:\n" + self.panel_log_tail())

    def _write_oom_profile(self) -> None:
        """A custom profile that fails with CUDA OOM at load (non-healing), saved the way the panel saves them."""
        from app.backend.profiles.custom import knobs_of, make_custom_profile, save_custom_profile
        from app.backend.recipe import load_recipe
        from app.backend.config.settings import Settings

        recipe = load_recipe(self.recipe)
        base = recipe.profile("quality")
        knobs = knobs_of(recipe, base)
        prof = make_custom_profile(recipe, base, OOM_PROFILE, {**knobs.env, "MOET_SIM_FAIL": "oom_at_load"},
                                   dict(knobs.args), {p.id for p in recipe.profiles})
        save_custom_profile(Settings(self.recipe, recipe, self.data, True), prof)

    def _watch_starts(self) -> None:
        flt = {"type": "container", "event": "start", "label": [f"moet-panel.recipe={self.rid}"]}
        self._events = self.docker.events(decode=True, filters=flt)

        def pump() -> None:
            try:
                for e in self._events:
                    self.starts.append((time.monotonic(), str(e.get("id", ""))))
            except Exception:  # closed at the end
                pass

        threading.Thread(target=pump, name="chaos-starts", daemon=True).start()

    def start_panel(self) -> float:
        """Start a panel process and wait until it runs; returns when it was spawned (monotonic)."""
        self.panel_n += 1
        spawned = time.monotonic()
        log = self.home / f"panel-{self.panel_n}.log"
        with open(log, "wb") as fh:
            self.panel = subprocess.Popen(
                [sys.executable, "-m", "bench.chaos.panel_main", *self.cli_base[3:], "serve", "--port", str(free_port())],
                cwd=ROOT, env=self.env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 120
        while "moet-panel is running" not in log.read_text(errors="replace"):
            if self.panel.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the panel did not start:\n" + log.read_text(errors="replace")[-3000:])
            time.sleep(0.2)
        head = log.read_text(errors="replace")
        if self.panel_n == 1 and "NOT APPLIED" in head:
            self.notes.append("the restart window was not shortened (ControllerOptions not found): the cap may "
                              "give up on the soak's pace")
        return spawned

    def scan_logs(self) -> tuple[int, int]:
        """(secrets found, decision lines) over the panel's stderr logs and its operator log (panel.log*)."""
        files = sorted(self.home.glob("panel-*.log")) + sorted((self.data / ".moet-panel").glob("panel.log*"))
        found = decisions = 0
        for f in files:
            try:
                text = f.read_text(errors="replace")
            except OSError:
                continue
            found += sum(text.count(x) for x in [*self.secrets, *self.keys])
            if f.name.startswith("panel.log"):
                decisions += sum(1 for line in text.splitlines() if " action=" in line)
        return found, decisions

    def panel_log_tail(self, n: int = 3000) -> str:
        return (self.home / f"panel-{self.panel_n}.log").read_text(errors="replace")[-n:]

    def kill_panel(self) -> None:
        """SIGKILL the panel; its children (the gateway) get 3 s to leave by themselves, then the group is killed
        (what systemd does to the unit's cgroup before a restart)."""
        assert self.panel is not None
        pid = self.panel.pid
        os.kill(pid, signal.SIGKILL)
        self.panel.wait()
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        self.stop_panel()
        if self._events is not None:
            self._events.close()
        for c in self.docker.containers.list(all=True, filters={"label": f"moet-panel.recipe={self.rid}"}):
            try:
                c.remove(force=True)
            except Exception:
                pass
        self.proxy.stop()
        self.http.close()
        (self.data / ".chaos-fill").unlink(missing_ok=True)
        if self.tmpfs:
            subprocess.run(["umount", "-l", str(self.data)], capture_output=True)
        shutil.rmtree(self.home, ignore_errors=True)

    # -- probes ---------------------------------------------------------------------------------------
    def cli(self, *args: str, check: bool = False, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.cli_base, *args], cwd=ROOT, env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=check)

    def status(self) -> dict[str, Any]:
        try:
            r = self.cli("engine", "status", "--json", timeout=60)
            return dict(json.loads(r.stdout).get("engine", {}))
        except Exception as exc:  # the CLI itself failed: say so in the cycle's line
            return {"state": "?", "message": f"engine status failed: {exc}"}

    def key(self) -> str:
        self.key_i += 1
        return self.keys[self.key_i % len(self.keys)]

    def engine(self) -> Any | None:
        """This recipe's running engine container (the truth, read on the real socket), or None."""
        run = self.docker.containers.list(filters={"label": ["moet-panel.managed=1", f"moet-panel.recipe={self.rid}"]})
        return run[0] if run else None

    def serving_once(self) -> bool:
        import httpx

        body = {"model": MODEL, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1,
                "chat_template_kwargs": {"thinking": False}}
        try:
            r = self.http.post(self.gateway + "/v1/chat/completions", json=body,
                               headers={"Authorization": f"Bearer {self.key()}"}, timeout=5)
            return r.status_code == 200
        except httpx.HTTPError:
            return False

    def wait_serving(self, timeout: float, profile: str | None = None) -> float | None:
        """Seconds until serving (on `profile` when given), or None after `timeout`."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            c = self.engine()
            if c is not None and (profile is None or c.labels.get("moet-panel.profile") == profile) \
                    and self.serving_once():
                return time.monotonic() - t0
            time.sleep(0.5)
        return None

    def starts_since(self, t: float) -> int:
        return sum(1 for at, _ in self.starts if at >= t)

    # -- one cycle ------------------------------------------------------------------------------------
    def person_start(self) -> None:
        """A person's start (the CLI) so that the next cycle begins serving; when the panel still refuses or does
        not serve, the person restarts the panel (counted: `panel_restarts`) and starts again."""
        for attempt in range(3):
            if self.engine() is not None:
                self.cli("engine", "stop", timeout=120)
            r = self.cli("engine", "start", "--profile", self.profile, timeout=180)
            if self.wait_serving(30) is not None:
                return
            print(f"    a person's start did not bring serving back (rc {r.returncode}): "
                  f"{(r.stdout + r.stderr).strip()[-300:]}", flush=True)
            if attempt == 1:
                self.panel_restarts += 1
                print("    so the person restarts the panel", flush=True)
                self.stop_panel()
                self.start_panel()

    def stop_panel(self) -> None:
        if self.panel is None or self.panel.poll() is not None:
            return
        try:
            os.killpg(self.panel.pid, signal.SIGTERM)
            self.panel.wait(30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.panel.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.panel.wait()

    def cycle(self, i: int, kind: str) -> None:
        s = self.stats[kind]
        s.cycles += 1
        if self.wait_serving(30) is None:
            self.person_start()
        c = self.engine()
        if c is None:
            print(f"[{i:3d}] {kind}: not serving before the fault; skipped", flush=True)
            s.cycles -= 1
            return
        cid = c.id
        detail = ""
        if kind in HEALING:
            cleared, detail = getattr(self, "_" + kind.replace(" -9", "").replace(" ", "_").replace("-", "_"))(c, s)
            back = self.wait_serving(self.o.restore_timeout_s,
                                     profile=self.profile if kind == "switch mid-stream" else None)
            if back is not None:
                total = time.monotonic() - cleared
                s.restored += 1
                s.back_s.append(total)
                outcome = f"serving again {total:.1f} s after it cleared"
            else:
                st = self.status()
                s.gave_up += bool(st.get("gave_up"))
                why = f"{st.get('state')} gave_up={st.get('gave_up')} desired={st.get('desired')}: " \
                      f"{str(st.get('message', ''))[:160]}"
                s.not_restored.append(f"cycle {i}: {why}")
                outcome = f"NOT serving {self.o.restore_timeout_s:g} s after it cleared ({why})"
                s.persons += 1
                self.person_start()
        elif kind == "outside stop":
            subprocess.run(["docker", "stop", "-t", "5", cid], capture_output=True)
            t0 = time.monotonic()
            time.sleep(self.o.observe_s)  # pacing: a restart would have to happen inside this window
            fought = self.starts_since(t0) > 0 or self.engine() is not None
            s.fought += fought
            outcome = "FOUGHT: the panel started it again" if fought else "respected"
            s.persons += 1
            self.person_start()
        else:  # non-healing
            self.cli("engine", "stop", timeout=120)
            r = self.cli("engine", "start", "--profile", OOM_PROFILE, timeout=120)
            t0 = time.monotonic()
            time.sleep(self.o.observe_s)
            n = self.starts_since(t0)
            s.non_healing_restarts += n
            outcome = (f"start rc {r.returncode}; " + (f"RESTARTED {n} times" if n else "not retried"))
            s.persons += 1
            self.person_start()
        if self.o.verbose:
            print(f"[{i:3d}] {kind}{detail}: {outcome}", flush=True)

    # -- the healing faults: each returns (monotonic time it cleared, detail) ------------------------
    def _engine_kill(self, c: Any, s: KindStats) -> tuple[float, str]:
        subprocess.run(["docker", "kill", c.id], capture_output=True)
        return time.monotonic(), ""

    def _panel_kill(self, c: Any, s: KindStats) -> tuple[float, str]:
        self.kill_panel()
        return self.start_panel(), ""

    def _docker_away(self, c: Any, s: KindStats) -> tuple[float, str]:
        n = self.rng.uniform(*self.o.away_s)
        t0 = time.monotonic()
        self.proxy.cut()
        subprocess.run(["docker", "stop", "-t", "5", c.id], capture_output=True)  # the daemon stops its containers
        time.sleep(max(0.0, n - (time.monotonic() - t0)))  # the fault's length, not a synchronisation
        self.proxy.restore()
        return time.monotonic(), f" ({n:.0f} s)"

    def _listen_address(self, c: Any) -> tuple[str, str]:
        """("uds", path) or ("tcp", port) from the engine container's own arguments."""
        args = list(c.attrs.get("Args") or [])
        if "--uds" in args:
            return "uds", args[args.index("--uds") + 1]
        return "tcp", args[args.index("--port") + 1] if "--port" in args else "8000"

    def _port_held(self, c: Any, s: KindStats) -> tuple[float, str]:
        kind, where = self._listen_address(c)
        n = self.rng.uniform(*self.o.away_s)
        subprocess.run(["docker", "kill", c.id], capture_output=True)
        holder = socket.socket(socket.AF_UNIX if kind == "uds" else socket.AF_INET, socket.SOCK_STREAM)
        if kind == "tcp":  # the dead engine's own connections leave the port in TIME_WAIT; the engine binds this way too
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        deadline = time.monotonic() + 5
        while True:
            try:
                if kind == "uds":
                    # the engine's socket path answered by someone else (the container's side is mounted here)
                    host_path = self._host_path(c, where)
                    Path(host_path).unlink(missing_ok=True)
                    holder.bind(host_path)
                else:
                    holder.bind(("127.0.0.1", int(where)))
                holder.listen(8)
                break
            except OSError:
                if time.monotonic() > deadline:
                    holder.close()
                    return time.monotonic(), f" (could not take {kind} {where})"
                time.sleep(0.05)
        t0 = time.monotonic()
        time.sleep(n)
        holder.close()
        if kind == "uds":
            Path(self._host_path(c, where)).unlink(missing_ok=True)
        return time.monotonic(), f" ({kind} {where}, {time.monotonic() - t0:.0f} s)"

    @staticmethod
    def _host_path(c: Any, container_path: str) -> str:
        for m in c.attrs.get("Mounts") or []:
            dest = str(m.get("Destination", ""))
            if container_path.startswith(dest.rstrip("/") + "/"):
                return str(m.get("Source", "")) + container_path[len(dest.rstrip("/")):]
        return container_path

    def _hang(self, c: Any, s: KindStats) -> tuple[float, str]:
        subprocess.run(["docker", "kill", "-s", "USR1", c.id], capture_output=True)
        return time.monotonic(), ""

    def _disk_full(self, c: Any, s: KindStats) -> tuple[float, str]:
        if not self.tmpfs:
            s.cycles -= 1
            return time.monotonic(), " (left out: no tmpfs)"
        fill = self.data / ".chaos-fill"
        n = self.rng.uniform(*self.o.disk_s)
        with open(fill, "wb", buffering=0) as fh:  # unbuffered: nothing left to flush into a full disk at close
            free = shutil.disk_usage(self.data).free
            try:
                os.posix_fallocate(fh.fileno(), 0, max(0, free - (1 << 20)))  # fast; the last MiB byte by byte below
            except OSError:
                pass
            fh.seek(0, os.SEEK_END)
            for size in (1 << 16, 4096, 1):
                try:
                    while True:
                        fh.write(b"\0" * size)
                except OSError:
                    pass
        subprocess.run(["docker", "kill", c.id], capture_output=True)  # the restart must write while full
        time.sleep(n)
        fill.unlink()
        return time.monotonic(), f" ({n:.0f} s)"

    def _switch_mid_stream(self, c: Any, s: KindStats) -> tuple[float, str]:
        """A chat streams through the gateway while the CLI switches profile; was the answer whole?"""
        target = self.rng.choice([p for p in PROFILES if p != c.labels.get("moet-panel.profile")])
        result: dict[str, Any] = {}
        started = threading.Event()
        t = threading.Thread(target=self._stream, args=(result, started), daemon=True)
        t.start()
        started.wait(15)
        t_switch = time.monotonic()
        r = self.cli("engine", "switch", "--profile", target, timeout=240)
        t.join(120)
        self.profile = target
        s.streams += 1
        whole = result.get("finish") == "length" and result.get("chunks", 0) >= 1 and not result.get("error")
        if not whole:
            s.cut += 1
        verdict = "whole" if whole else f"CUT after {result.get('chunks', 0)} chunks ({result.get('error', '')[:80]})"
        return t_switch, f" (to {target}, switch rc {r.returncode}; the answer {verdict})"

    def _stream(self, out: dict[str, Any], started: threading.Event) -> None:
        import httpx

        body = {"model": MODEL, "messages": [{"role": "user", "content": "tell a long story"}],
                "max_tokens": self.o.stream_tokens, "ignore_eos": True, "stream": True,
                "chat_template_kwargs": {"thinking": False}}
        chunks = 0
        try:
            with httpx.stream("POST", self.gateway + "/v1/chat/completions", json=body, timeout=httpx.Timeout(120),
                              headers={"Authorization": f"Bearer {self.key()}"}) as r:
                if r.status_code != 200:
                    out["error"] = f"HTTP {r.status_code}"
                    return
                for line in r.iter_lines():
                    if not line.startswith("data: {"):
                        continue
                    obj = json.loads(line[6:])
                    for ch in obj.get("choices") or []:
                        if ch.get("delta", {}).get("content"):
                            chunks += 1
                            if chunks == 10:
                                started.set()
                        if ch.get("finish_reason"):
                            out["finish"] = ch["finish_reason"]
        except (httpx.HTTPError, ValueError) as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            out["chunks"] = chunks
            started.set()

    # -- the run --------------------------------------------------------------------------------------
    def run(self) -> Report:
        t0 = time.monotonic()
        kinds = [k for k in schedule(self.o.cycles, self.o.seed) if self.tmpfs or k != "disk full"]
        self.setup()
        for i, kind in enumerate(kinds):
            self.cycle(i, kind)
            if self.o.progress_file is not None:
                rep = Report(self.stats, time.monotonic() - t0, self.notes, self.panel_restarts)
                self.o.progress_file.write_text(f"after cycle {i + 1} of {len(kinds)}\n{rep.table()}\n"
                                                + "".join(f"  not restored: {w}\n" for w in rep.healing_failures()))
        return Report(self.stats, time.monotonic() - t0, self.notes, self.panel_restarts)


def soak(opts: Options) -> Report:
    chaos = Chaos(opts)
    try:
        report = chaos.run()
        report.secrets_in_logs, report.decision_lines = chaos.scan_logs()
        return report
    finally:
        chaos.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--cycles", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--short", action="store_true",
                    help="the CI form (short_form): a 2 s restart backoff, shorter faults (Docker away / port held 5-6 s, "
                         "disk full 5 s: each still outlasts the first backoff), 5 s watches, a 40 s restore timeout")
    ap.add_argument("--restore-timeout-s", type=float, default=None)
    ap.add_argument("--observe-s", type=float, default=None, help="default 9 (5 with --short)")
    ap.add_argument("--progress-file", type=Path, default=None, help="rewrite the table there after every cycle")
    ap.add_argument("--restart-window-s", type=float, default=None,
                    help="the soak panel's restart-cap window, default 10 (4 with --short; bench/chaos/panel_main.py "
                         "says why)")
    args = ap.parse_args(argv)
    opts = short_form(args.cycles, args.seed) if args.short else Options(cycles=args.cycles, seed=args.seed)
    opts.progress_file = args.progress_file
    for name in ("restore_timeout_s", "observe_s", "restart_window_s"):  # what the command line names wins
        if getattr(args, name) is not None:
            setattr(opts, name, getattr(args, name))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally blocks clean up
    print(f"chaos soak: {opts.cycles} cycles, seed {opts.seed}, SIMULATED engine on the real Docker", flush=True)
    report = soak(opts)
    for n in report.notes:
        print(f"note: {n}")
    print(report.table())
    for w in report.healing_failures()[:20]:
        print(f"  not restored: {w}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
