"""Preflight checklist before starting an engine: each item pass / warn / fail, with the fix.

Failing items block a start unless that item id is explicitly overridden by the user.
Pure-ish: every external fact comes in through `PreflightInputs` (runtime, GPU reader, paths), so
tests pass fakes for the GPU and real Docker for the rest.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal

import psutil

from app.backend.engine.logs.diagnosis import CARD_PIN
from app.backend.engine.runtime.base import Runtime, RuntimeOpError, RuntimeUnavailable
from app.backend.recipe.schema import Recipe
from app.backend.contracts import GpuReader, GpuSample
from app.backend.contracts import GiB, docker_size_bytes

Status = Literal["pass", "warn", "fail"]


@dataclass(frozen=True)
class PreflightItem:
    id: str
    title: str
    status: Status
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class PreflightReport:
    items: tuple[PreflightItem, ...]
    overrides: frozenset[str] = frozenset()

    def blocking(self) -> list[PreflightItem]:
        """Failed items the user did not override."""
        return [i for i in self.items if i.status == "fail" and i.id not in self.overrides]

    @property
    def ok(self) -> bool:
        return not self.blocking()

    def summary(self) -> str:
        counts = {s: sum(1 for i in self.items if i.status == s) for s in ("pass", "warn", "fail")}
        text = f"{counts['pass']} pass, {counts['warn']} warn, {counts['fail']} fail"
        overridden = [i.id for i in self.items if i.status == "fail" and i.id in self.overrides]
        return text + (f" ({', '.join(overridden)} overridden)" if overridden else "")


@dataclass
class PreflightInputs:
    recipe: Recipe
    env: dict[str, str]  # the profile's container env (from the RunSpec)
    data_dir: Path
    runtime: Runtime | None
    runtime_error: str = ""
    gpu_reader: GpuReader | None = None
    engine_running: bool = False  # our own engine holds the port / GPU memory
    engine_pids: set[int] = field(default_factory=set)
    artifact_status: Callable[[str], str | None] | None = None  # id -> "complete"/"partial"/... or None
    gpu: int | None = None  # the GPU this engine runs on, on a box of several (None: the first the reader lists)
    engines: int = 1  # engines this box runs (one per GPU: docs/engine.md "Several GPUs"): the host's share


def run_preflight(inp: PreflightInputs, overrides: frozenset[str] = frozenset()) -> PreflightReport:
    items = [_docker(inp), _nvidia_runtime(inp), *_gpu_items(inp), _host_ram(inp), _disk(inp)]
    if inp.engines > 1:
        items.append(host_share(inp.recipe, inp.engines, psutil.virtual_memory().total))
    items += _artifacts(inp)
    items += [_ckpt_pin(inp), _image(inp), _listen(inp)]
    return PreflightReport(tuple(items), frozenset(overrides))


def _docker(inp: PreflightInputs) -> PreflightItem:
    title = "Docker daemon reachable and permitted"
    if inp.runtime is None:
        return PreflightItem("docker", title, "fail", inp.runtime_error or "no runtime",
                             "Start dockerd (`sudo systemctl start docker`) and add yourself to the docker group.")
    if inp.runtime.kind == "process":
        return PreflightItem("docker", title, "pass", "not used: SIMULATED engine runs as a local process")
    try:
        inp.runtime.check()
        return PreflightItem("docker", title, "pass", inp.runtime.describe())
    except (RuntimeUnavailable, RuntimeOpError) as exc:
        return PreflightItem("docker", title, "fail", str(exc),
                             "Start dockerd (`sudo systemctl start docker`); `sudo usermod -aG docker $USER` and log in again.")


def _nvidia_runtime(inp: PreflightInputs) -> PreflightItem:
    title = "NVIDIA container runtime / CDI registered"
    if inp.recipe.simulated or not inp.recipe.serve.gpus:
        return PreflightItem("nvidia_runtime", title, "pass", "not needed (SIMULATED engine, no GPU)")
    if inp.runtime is None or inp.runtime.kind != "docker":
        return PreflightItem("nvidia_runtime", title, "fail", "Docker is not available")
    try:
        info = inp.runtime.info()
    except (RuntimeUnavailable, RuntimeOpError) as exc:
        return PreflightItem("nvidia_runtime", title, "fail", str(exc))
    runtimes = list(info.get("runtimes") or [])  # type: ignore[call-overload]
    cdi = list(info.get("cdi_spec_dirs") or [])  # type: ignore[call-overload]
    if "nvidia" in runtimes or cdi:
        return PreflightItem("nvidia_runtime", title, "pass", f"runtimes {runtimes}, CDI spec dirs {cdi}")
    return PreflightItem(
        "nvidia_runtime", title, "fail", f"Docker runtimes {runtimes} and no CDI spec dirs",
        "Install nvidia-container-toolkit, then `sudo nvidia-ctk runtime configure --runtime=docker && "
        "sudo systemctl restart docker`.",
    )


def _gpu_items(inp: PreflightInputs) -> list[PreflightItem]:
    req = inp.recipe.requirements
    if inp.recipe.simulated or req.gpu_count == 0:
        note = "not needed (SIMULATED engine)"
        return [PreflightItem(i, t, "pass", note) for i, t in (
            ("gpu", "GPU model, VRAM, compute capability"), ("ecc", "ECC mode"), ("gpu_memory", "GPU memory free"))]
    reader = inp.gpu_reader
    samples: list[GpuSample] = []
    if reader is not None and reader.available:
        try:
            samples = reader.read()
        except Exception as exc:  # a flaky driver call must not crash preflight
            return [PreflightItem("gpu", "GPU model, VRAM, compute capability", "fail", f"GPU read failed: {exc}")]
    if not samples:
        why = reader.error if reader is not None else "no GPU reader"
        return [PreflightItem("gpu", "GPU model, VRAM, compute capability", "fail", why or "no GPU found",
                              "Install the NVIDIA driver; check `nvidia-smi`.")]
    gpu = next((s for s in samples if s.index == inp.gpu), None) if inp.gpu is not None else samples[0]
    if gpu is None:
        return [PreflightItem("gpu", "GPU model, VRAM, compute capability", "fail",
                              f"GPU {inp.gpu} is not among the {len(samples)} GPU(s) the driver lists",
                              "Pick a GPU `nvidia-smi -L` lists (--gpu).")]
    items = [_gpu_model(inp, gpu), _ecc(inp, gpu), _gpu_memory(inp, gpu)]
    if len(samples) > 1 and req.multi_gpu_note:  # the card's single-GPU limit, shown only where it matters
        items.append(PreflightItem("gpu_count", "Single-GPU artifacts", "pass",
                                   f"{len(samples)} GPUs visible; the recipe serves on one ({inp.recipe.serve.gpus or 'all'})",
                                   "The card: " + req.multi_gpu_note))
    return items


def _gpu_model(inp: PreflightInputs, gpu: GpuSample) -> PreflightItem:
    req = inp.recipe.requirements
    title = "GPU model, VRAM, compute capability"
    cc = f"{gpu.compute_capability[0]}.{gpu.compute_capability[1]}" if gpu.compute_capability else "?"
    want_sm = req.compute_capability.replace(".", "")
    detail = f"{gpu.name}, {gpu.memory_total / GiB:.1f} GiB, sm_{cc.replace('.', '')} (recipe: {req.gpu}, sm_{want_sm})"
    if gpu.memory_total < req.vram_gb * 1e9 * 0.93:
        return PreflightItem("gpu", title, "fail", detail, f"The recipe needs a {req.vram_gb:g} GB card ({req.gpu}).")
    if req.compute_capability and cc != req.compute_capability:
        return PreflightItem("gpu", title, "warn", detail,
                             "The engine's cubins are built for sm_120; other GPUs are not what the card measured.")
    return PreflightItem("gpu", title, "pass", detail)


def _ecc(inp: PreflightInputs, gpu: GpuSample) -> PreflightItem:
    req = inp.recipe.requirements
    title = "ECC mode"
    fix = req.ecc_note or "sudo nvidia-smi -e 0, then reboot"
    if req.ecc != "off":
        return PreflightItem("ecc", title, "pass", "recipe accepts any ECC mode")
    if gpu.ecc_current:
        return PreflightItem("ecc", title, "fail", f"ECC is ON: costs ~{req.ecc_cost_gib:g} GiB the planes need", fix)
    if gpu.ecc_pending:
        return PreflightItem("ecc", title, "warn", "ECC will turn ON at the next reboot", fix)
    if gpu.ecc_current is None:
        return PreflightItem("ecc", title, "pass", "not supported by this GPU / driver (treated as off)")
    return PreflightItem("ecc", title, "pass", "ECC off")


def _gpu_memory(inp: PreflightInputs, gpu: GpuSample) -> PreflightItem:
    title = "GPU memory free (no other processes)"
    others = [p for p in gpu.processes if p.pid not in inp.engine_pids]
    other_bytes = sum(p.used_bytes or 0 for p in others)
    if inp.engine_running:
        return PreflightItem("gpu_memory", title, "pass", "held by this panel's engine (a switch stops it first)")
    used = max(gpu.memory_used, other_bytes)
    detail = f"{used / GiB:.1f} GiB in use" + (f" by {len(others)} other process(es)" if others else "")
    need = inp.recipe.vram.expected_gib * GiB
    if gpu.memory_total - used < need:
        return PreflightItem("gpu_memory", title, "fail", detail,
                             "Stop the other GPU processes (`nvidia-smi` lists them); the engine needs "
                             f"~{inp.recipe.vram.expected_gib:g} GiB.")
    if used > 1 * GiB:
        return PreflightItem("gpu_memory", title, "warn", detail, "Other processes hold GPU memory.")
    return PreflightItem("gpu_memory", title, "pass", detail)


def _host_ram(inp: PreflightInputs) -> PreflightItem:
    req = inp.recipe.requirements
    total = psutil.virtual_memory().total / 1e9
    title = "Host RAM"
    detail = f"{total:.0f} GB total"
    if req.host_ram_gb and total < req.host_ram_gb * 0.95:
        # Not a serving requirement: the card's ~64 GB is where a planes-cache MISS (re-staging) OOM-kills the host.
        return PreflightItem("host_ram", title, "warn", detail + f" — below the card's ~{req.host_ram_gb:g} GB, a planes-cache "
                             "miss would OOM-kill this host; a cache hit (the recipe pins VLLM_MOE_W2_CKPT_ID) needs no staging",
                             req.host_ram_note or "Add RAM or stop memory-hungry processes.")
    return PreflightItem("host_ram", title, "pass", detail)


def host_share(recipe: Recipe, engines: int, ram_total: int) -> PreflightItem:
    """The host's share for N engines, one per GPU (docs/engine.md "Several GPUs"): the store is read with pread by
    every engine, so its disk and page cache are shared (one copy); host RAM and `/dev/shm` count per engine.
    Fails when N engines' `/dev/shm` alone exceeds the host's RAM (tmpfs is RAM: they cannot all fit); warns when
    the host has less RAM than N times the recipe's floor (a planes-cache miss on several engines at once)."""
    title = f"Host share for {engines} engines (one per GPU)"
    shm_each = docker_size_bytes(recipe.serve.shm_size) if recipe.serve.ipc != "host" else 0
    shm_need = engines * shm_each
    ram_floor = engines * recipe.requirements.host_ram_gb * 1e9
    store = sum(a.extracted_gib for a in recipe.artifacts) * GiB
    need = (f"{engines} engines need: /dev/shm {shm_need / GiB:.0f} GiB ({engines} × {recipe.serve.shm_size or '0'}"
            + (", the host's shared /dev/shm with --ipc host" if recipe.serve.ipc == "host" else "")
            + f"), host RAM ~{ram_floor / 1e9:.0f} GB on a planes-cache miss ({engines} × the card's "
            f"{recipe.requirements.host_ram_gb:g} GB), one store on disk and in the page cache ({store / GiB:.0f} GiB,"
            f" shared: every engine preads the same files); this host has {ram_total / 1e9:.0f} GB RAM")
    if shm_need > ram_total:
        return PreflightItem("host_share", title, "fail", need,
                             f"Run fewer engines (--gpu), or lower shm_size in the recipe: {engines} × "
                             f"{recipe.serve.shm_size} of /dev/shm is more than the host's RAM.")
    if ram_floor and ram_total < ram_floor * 0.95:
        return PreflightItem("host_share", title, "warn", need,
                             "Keep the ckpt pin (a cache hit stages nothing), or run fewer engines at once.")
    return PreflightItem("host_share", title, "pass", need)


def _disk(inp: PreflightInputs) -> PreflightItem:
    probe = inp.data_dir
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free / GiB
    title = "Free disk in the data dir"
    detail = f"{free:.1f} GiB free at {probe}"
    if free < 1:
        return PreflightItem("disk", title, "fail", detail, "Free disk space: the engine writes caches and logs.")
    if free < 10:
        return PreflightItem("disk", title, "warn", detail, "Less than 10 GiB free.")
    return PreflightItem("disk", title, "pass", detail)


def _artifacts(inp: PreflightInputs) -> list[PreflightItem]:
    out = []
    for art in inp.recipe.artifacts:
        path = inp.data_dir / art.yields
        status = inp.artifact_status(art.id) if inp.artifact_status else None
        present = path.is_dir() and any(path.iterdir())
        complete = status == "complete" if status else present
        detail = f"{path}: " + (status or ("present" if present else "missing"))
        item_id, title = f"artifact:{art.id}", f"Artifact {art.id} present and complete"
        if complete:
            out.append(PreflightItem(item_id, title, "pass", detail))
        elif not art.required_for_serving:
            out.append(PreflightItem(item_id, title, "pass", detail + " (not required for serving)"))
        elif status:  # the journal knows a download began here: resume it, verified parts are kept
            out.append(PreflightItem(item_id, title, "fail", detail,
                                     f"Resume the download: `moet-panel download {art.id}` (or Downloads tab → Resume)."))
        else:
            out.append(PreflightItem(item_id, title, "fail", detail, f"Download it: `moet-panel download {art.id}`."))
    return out


def cache_meta_ids(data_dir: Path, recipe: Recipe) -> list[tuple[str, str]]:
    """(meta.json path, ckpt_id) for every TP1 planes-cache subtree (docs/engine.md, "Engine facts": planes cache identity)."""
    roots = [data_dir / a.yields for a in recipe.artifacts if a.id == "planescache"] or [data_dir / "planescache"]
    out = []
    for root in roots:
        for meta in sorted(glob.glob(os.path.join(glob.escape(str(root)), "v2", "*", "tp1-rank0", "meta.json"))):
            try:
                out.append((meta, str(json.loads(Path(meta).read_text()).get("ckpt_id", ""))))
            except (OSError, ValueError):
                out.append((meta, "(unreadable)"))
    return out


def _ckpt_pin(inp: PreflightInputs) -> PreflightItem:
    env_name = inp.recipe.model.ckpt_id_env
    pin = inp.env.get(env_name, "")
    title = "Checkpoint identity pin matches the cache"
    if not pin:
        return PreflightItem("ckpt_pin", title, "fail", f"{env_name} is not set", CARD_PIN)
    metas = cache_meta_ids(inp.data_dir, inp.recipe)
    if not metas:
        return PreflightItem("ckpt_pin", title, "warn", f"{env_name}={pin[:12]}…; no planes-cache meta.json found to compare",
                             "Download the planescache artifact.")
    if any(cid == pin for _, cid in metas):
        return PreflightItem("ckpt_pin", title, "pass", f"{env_name} = meta.json ckpt_id ({pin[:12]}…)")
    got = ", ".join(f"{cid[:12]}…" for _, cid in metas)
    return PreflightItem("ckpt_pin", title, "fail", f"{env_name}={pin[:12]}… but meta.json has {got}",
                         f"Set {env_name} to the cache's meta.json ckpt_id. " + CARD_PIN)


def _image(inp: PreflightInputs) -> PreflightItem:
    image = inp.recipe.engine.image
    title = f"Engine image {image} present"
    if inp.runtime is None or inp.runtime.kind == "process":
        return PreflightItem("image", title, "pass", "not needed (process runtime)")
    try:
        if inp.runtime.image_present(image):
            return PreflightItem("image", title, "pass", "present")
    except (RuntimeUnavailable, RuntimeOpError) as exc:
        return PreflightItem("image", title, "fail", str(exc))
    if inp.recipe.simulated:
        return PreflightItem("image", title, "warn", "missing; the panel builds the SIMULATED image on start")
    return PreflightItem("image", title, "fail", "missing (nothing can be pulled here)",
                         "`moet-panel engine build-image --source <vLLM-Moet checkout>`")


def _listen(inp: PreflightInputs) -> PreflightItem:
    """Where the engine will listen (docs/engine.md, "Where the engine listens"): its socket's directory for a
    uds engine, the port for a TCP one (with a warning: a web page the owner opens can reach a TCP engine)."""
    if inp.recipe.serve.listen == "tcp":
        return _port(inp)
    return _socket(inp)


TCP_ENGINE_WARNING = ("this recipe's engine listens on TCP (listen = \"tcp\": its vLLM has no --uds), on loopback: any "
                      "web page the owner opens can reach it (a no-cors POST, a DNS-rebinding Host; vLLM checks "
                      "neither) and so can every user of this box")


def _port(inp: PreflightInputs) -> PreflightItem:
    from app.backend.engine.runtime.readiness import port_in_use

    port = inp.recipe.serve.port + (inp.gpu or 0)  # GPU N of a box of several listens on port + N
    title = f"Port {port} free"
    fix_warn = "Use an engine build with vLLM's --uds and set listen = \"uds\" in the recipe's [serve] (docs/engine.md)."
    if not port_in_use(inp.recipe.serve.host, port):
        return PreflightItem("port", title, "warn", f"free; {TCP_ENGINE_WARNING}", fix_warn)
    if inp.engine_running:
        return PreflightItem("port", title, "warn", f"held by this panel's engine; {TCP_ENGINE_WARNING}", fix_warn)
    return PreflightItem("port", title, "fail", f"something else listens on {port}",
                         f"Find it with `ss -ltnp | grep :{port}` and stop it.")


def _socket(inp: PreflightInputs) -> PreflightItem:
    from app.backend.engine.runtime.readiness import socket_dir_problem, socket_in_use
    from app.backend.recipe.endpoint import EndpointError, socket_dir, socket_path

    title = "Engine socket directory"
    try:
        path = Path(socket_path(inp.data_dir, inp.gpu))
    except EndpointError as exc:
        return PreflightItem("socket", title, "fail", str(exc), "Use a shorter data dir (--data-dir).")
    sock_dir = Path(socket_dir(inp.data_dir))
    problem = socket_dir_problem(sock_dir)
    if problem:
        return PreflightItem("socket", title, "fail", problem,
                             f"Remove {sock_dir}: the panel makes it again, 0700 and its own.")
    mode = f"{sock_dir.stat().st_mode & 0o777:o}" if sock_dir.exists() else "made 0700 at start"
    if path.exists() and socket_in_use(str(path)):
        if inp.engine_running:
            return PreflightItem("socket", title, "pass", f"{path} (mode {mode}): this panel's engine listens there")
        # its own id: a listener that goes away heals (restartpolicy.PREFLIGHT_CAUSES), a bad dir does not
        return PreflightItem("socket_busy", title, "fail", f"something else answers on {path}",
                             f"Find it with `ss -xlp | grep {path}` and stop it.")
    return PreflightItem("socket", title, "pass", f"{path} (directory {mode}; no TCP port is opened)")
