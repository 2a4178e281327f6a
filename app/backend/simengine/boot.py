"""SIMULATED boot sequence: the engine's load lines in their real formats (docs/simengine.md, Log output).

The engine controller classifies load phases from these lines, so formats follow the engine
exactly; only the banner line (and figures being synthetic) says SIMULATED.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable

from .config import SimEngineConfig
from .delta import AUTO_FREE_AFTER_KV_GIB, N_EXPERTS, N_LAYERS, SLOT_MIB, TierPlan
from .logsink import LogSink

VLLM_VERSION = "0.24.0"
PLANES_PER_LAYER_GIB = 1.69
ROUTES = (
    ("/health", "GET"), ("/load", "GET"), ("/ping", "GET"), ("/v1/models", "GET"),
    ("/version", "GET"), ("/v1/chat/completions", "POST"), ("/v1/completions", "POST"), ("/metrics", "GET"),
)


class SimExit(Exception):
    """The simulated process ends with this exit code (1 = Python error, 137 = SIGKILL)."""

    def __init__(self, code: int, reason: str):
        super().__init__(reason)
        self.code = code
        self.reason = reason


class Stopped(Exception):
    """stop() was called while booting."""


@dataclass
class BootFigures:
    kv_tokens: int
    elapsed_s: float


class BootSequence:
    def __init__(self, cfg: SimEngineConfig, log: LogSink, plan: TierPlan, sleep: Callable[[float], bool],
                 clock: Callable[[], float], port: int, on_ready: Callable[[], None] = lambda: None):
        self.cfg, self.log, self.plan = cfg, log, plan
        self._on_ready = on_ready  # called just before uvicorn's "Application startup complete." 
        self._sleep = sleep  # returns True when stop was requested
        self._clock = clock
        self.port = port
        self.boot_s = cfg.boot_s * (10.0 if cfg.fail == "slow_boot" else 1.0)
        self.cache_hit = cfg.fail not in ("cache_miss", "host_oom") and bool(cfg.expected_ckpt_id) and (
            cfg.env_str("VLLM_MOE_W2_CKPT_ID") == cfg.expected_ckpt_id)
        self._t0 = clock()

    def _wait_until(self, frac: float) -> None:
        remaining = self._t0 + self.boot_s * frac - self._clock()
        if remaining > 0 and self._sleep(remaining):
            raise Stopped()

    def run(self) -> BootFigures:
        cfg, log = self.cfg, self.log
        self._banner()
        self._wait_until(0.05)
        log.engine("core.py:93", f"Initializing a V1 LLM engine (v{VLLM_VERSION}) with config: model='{cfg.model}', "
                   f"tokenizer='{cfg.model}', dtype=torch.bfloat16, max_seq_len={cfg.max_model_len}, "
                   "tensor_parallel_size=1, quantization=mxfp4, enforce_eager=False, device_config=cuda, "
                   f"served_model_name={cfg.served_name}, seed={cfg.seed}")
        log.engine("parallel_state.py:1208", "rank 0 in world size 1 is assigned as DP rank 0, PP rank 0, TP rank 0, EP rank 0")
        log.engine("gpu_model_runner.py:2338", f"Starting to load model {cfg.model}...")
        self._wait_until(0.08)
        log.engine("moe_w2_cubit.py:549", "moe_w2_cubit: AFRAG prefill cubins loaded for K=[7168, 2048]")
        log.engine("moe_w2_cubit.py:559", "moe_w2_cubit: cubins loaded: [('w2', 7168), ('w2', 6144), ('w2', 4096), "
                   "('w2', 2048), ('w2', 1024), ('w2', 512)]")
        self._tier_lines()
        self._layers()
        loaded_gib = N_LAYERS * PLANES_PER_LAYER_GIB + 2.83 + (0 if self.plan.auto else self.plan.slots * SLOT_MIB / 1024)
        log.engine("default_loader.py:267", f"Loading weights took {self._elapsed() * 0.8:.2f} seconds")
        # the loader's tqdm bar ends on stderr just after that line, as real vLLM's does (docs/real-engine.md)
        log.plain("Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00, 186.38it/s]")
        log.engine("gpu_model_runner.py:2392",
                   f"Model loading took {loaded_gib:.4f} GiB memory and {self._elapsed():.6f} seconds")
        self._wait_until(0.8)
        kv_gib = 93.8 - 0.52 - loaded_gib - (0 if not self.plan.auto else 0.0)
        kv_tokens = int(cfg.max_model_len * 1.1)
        log.engine("gpu_worker.py:298", f"Available KV cache memory: {max(kv_gib, 0.5):.2f} GiB")
        log.engine("kv_cache_utils.py:1087", f"GPU KV cache size: {kv_tokens:,} tokens")
        log.engine("kv_cache_utils.py:1091",
                   f"Maximum concurrency for {cfg.max_model_len:,} tokens per request: {kv_tokens / cfg.max_model_len:.2f}x")
        self._auto_line()
        self._wait_until(0.92)
        log.engine("gpu_model_runner.py:3118", f"Graph capturing finished in {max(1, round(self.boot_s * 0.1))} secs, took 0.52 GiB")
        log.engine("core.py:210", f"init engine (profile, create kv cache, warmup model) took {self._elapsed() * 0.3:.2f} seconds")
        self._wait_until(1.0)
        self._serving_lines()
        return BootFigures(kv_tokens=kv_tokens, elapsed_s=self._elapsed())

    def _elapsed(self) -> float:
        return self._clock() - self._t0

    def _banner(self) -> None:
        cfg, log = self.cfg, self.log
        log.api("api_server.py:1885", f"vLLM API server version {VLLM_VERSION}")
        log.api("api_server.py:1886", "SIMULATED engine (moet-panel sim-engine): no GPU, no model weights — "
                "log lines use the real engine formats, every figure is synthetic")
        args = {"model": cfg.model, "served_model_name": [cfg.served_name], "max_model_len": cfg.max_model_len,
                **({"uds": self.cfg.uds} if self.cfg.uds else {"port": self.port})}
        if cfg.max_num_seqs != 256:
            args["max_num_seqs"] = cfg.max_num_seqs
        log.api("utils.py:326", f"non-default args: {args}")
        log.api("model.py:547", "Resolved architecture: DeepseekV4ForCausalLM")
        log.api("model.py:1520", f"Using max model len {cfg.max_model_len}")

    def _tier_lines(self) -> None:
        plan, log = self.plan, self.log
        if plan.store_dir and plan.exists:
            key = hashlib.sha256((self.cfg.env_str("VLLM_MOE_W2_CKPT_ID") or "unverified").encode()).hexdigest()[:20]
            pack = f"{plan.store_dir.rstrip('/')}/delta.v2.{key}.rank0of1.pack"
            log.engine("moe_w2_store.py:939", f"moe_w2 store[delta]: PACK-FILE backend {pack} (slot {SLOT_MIB:.2f} MiB, "
                       f"stride {int(SLOT_MIB * 1024 * 1024)}, 44 layers x {N_EXPERTS} experts; host RAM tier = page cache)")
            if self.cache_hit:
                log.engine("moe_w2_store.py:350", f"moe_w2 store[delta]: pack {pack} has {N_LAYERS}/{N_LAYERS} layers "
                           "— staging for those layers will be SKIPPED (persistent quant cache)")
        if plan.exists and self.cfg.build == "next":  # the newer build's EXL3 staging line (main's log form)
            log.engine("moe_w2_cubit.py:1173", f"moe_w2 EXL3 v2: FP4 need-pool staging from checkpoint (own-scale "
                       f"slots {SLOT_MIB:.2f} MiB [fp4_13|sc13|fp4_2|sc2]; policy=need)")
        if plan.exists and plan.auto:
            log.engine("moe_w2_delta.py:424", f"moe_w2 delta tier: auto-sizing deferred until after KV-cache allocation "
                       f"(slot {SLOT_MIB:.1f} MiB, reserve 3.0 GiB)")
        elif plan.exists:
            log.engine("moe_w2_delta.py:428", f"moe_w2 delta tier: {plan.slots} slots x {SLOT_MIB:.1f} MiB "
                       f"({plan.slots * SLOT_MIB / 1024:.2f} GiB pool)")
        if plan.exists and plan.trace >= 1:
            dump = f", dump -> {plan.dump}" if plan.dump else ""
            log.engine("moe_w2_delta.py:432", f"moe_w2 delta trace ON: level {plan.trace}, every {plan.every} ticks{dump}")

    def _layers(self) -> None:
        log = self.log
        if self.cache_hit:
            log.engine("moe_w2_cubit.py:840", "moe_w2 LOADER-SKIP armed: pack-resident expert layers are neither "
                       "host-staged nor copied from the checkpoint (first: key 0)")
        elif self.cfg.env_str("VLLM_MOE_W2_PLANES_CACHE"):
            log.engine("moe_w2_planes_cache.py:237", "moe_w2 planes cache: metadata mismatch in "
                       f"{self.cfg.env_str('VLLM_MOE_W2_PLANES_CACHE')}/v2 — treating as a normal cache miss", "WARNING")
        for layer in range(N_LAYERS):
            self._wait_until(0.1 + 0.6 * layer / N_LAYERS)
            if self.cfg.fail == "host_oom" and layer == 18:
                raise SimExit(137, "host OOM while building planes (SIGKILL)")
            if self.cfg.fail == "boot_guard" and layer == 2:
                log.engine("moe_w2_delta.py:301", "RuntimeError: VLLM_MOE_W2_GATE=1 but no FP4 delta tier is "
                           "configured (VLLM_MOE_W2_DELTA_GB=0); refusing to serve", "ERROR")
                raise SimExit(1, "boot guard refused the configuration")
            if self.cfg.fail == "oom_at_load" and layer == 31:
                self._oom_traceback()
                raise SimExit(1, "CUDA out of memory at load")
            if self.cache_hit:
                log.engine("moe_w2_cubit.py:1582", f"moe_w2: layer {layer} planes from cache")
            else:
                log.engine("moe_w2_cubit.py:1785", f"moe_w2: layer {layer} planes built ({PLANES_PER_LAYER_GIB:.2f} GiB)")

    def _auto_line(self) -> None:
        plan, log = self.plan, self.log
        if not (plan.exists and plan.auto):
            return
        if plan.disabled_auto:
            log.engine("moe_w2_delta.py:505", "moe_w2 delta tier AUTO: 2.37 GiB free after KV < reserve 3.0 GiB -> "
                       "pool disabled (0 slots, pure 2-bit; host store released)")
        else:
            log.engine("moe_w2_delta.py:516", f"moe_w2 delta tier AUTO: {plan.slots} slots x {SLOT_MIB:.1f} MiB "
                       f"({plan.slots * SLOT_MIB / 1024:.2f} GiB pool; {AUTO_FREE_AFTER_KV_GIB:.2f} GiB was free after KV, "
                       "reserve 3.0 GiB)")

    def _serving_lines(self) -> None:
        log = self.log
        log.api("api_server.py:1620", "Supported tasks: ['generate']")
        where = f"unix:{self.cfg.uds}" if self.cfg.uds else f"http://{self.cfg.host or '0.0.0.0'}:{self.port}"
        log.api("api_server.py:1971", f"Starting vLLM API server 0 on {where}")
        log.api("launcher.py:37", "Available routes are:")
        for path, methods in ROUTES:
            log.api("launcher.py:45", f"Route: {path}, Methods: {methods}")
        log.uvicorn(f"Started server process [{log.api_pid}]")
        log.uvicorn("Waiting for application startup.")
        self._on_ready()  # /health answers 200 from the moment the ready line can be read
        log.uvicorn("Application startup complete.")

    def _oom_traceback(self) -> None:
        log = self.log
        log.engine("core.py:708", "EngineCore failed to start.", "ERROR")
        log.engine_plain(OOM_TRACEBACK)
        log.plain("\n".join(f"(APIServer pid={log.api_pid}) {ln}" for ln in API_INIT_FAILED.splitlines()))


OOM_TRACEBACK = """Traceback (most recent call last):
  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 699, in run_engine_core
    engine_core = EngineCoreProc(*args, **kwargs)
  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 498, in __init__
    super().__init__(vllm_config, executor_class, log_stats,
  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 83, in __init__
    self.model_executor = executor_class(vllm_config)
  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu_model_runner.py", line 2345, in load_model
    self.model = model_loader.load_model(
  File "/usr/local/lib/python3.12/dist-packages/vllm/model_executor/layers/quantization/utils/moe_w2_cubit.py", line 1779, in build_layer_planes
    planes = torch.empty((E, N, K // 4), dtype=torch.uint8, device=dev)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.69 GiB. GPU 0 has a total capacity of 94.97 GiB of which 812.06 MiB is free. Including non-PyTorch memory, this process has 94.16 GiB memory in use. Of the allocated memory 92.91 GiB is allocated by PyTorch, and 611.38 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"""  # noqa: E501 (verbatim engine output)

API_INIT_FAILED = """Traceback (most recent call last):
  File "/usr/local/bin/vllm", line 10, in <module>
    sys.exit(main())
  File "/usr/local/lib/python3.12/dist-packages/vllm/entrypoints/cli/main.py", line 73, in main
    args.dispatch_function(args)
  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/utils.py", line 912, in wait_for_engine_startup
    raise RuntimeError(
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore_DP0': 1}"""

FATAL_TRACEBACK = """Traceback (most recent call last):
  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 924, in run_engine_core
    engine_core.run_busy_loop()
  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 951, in run_busy_loop
    self._process_engine_step()
  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu_model_runner.py", line 2901, in execute_model
    torch.cuda.synchronize()
torch.AcceleratorError: CUDA error: an illegal memory access was encountered
CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect."""
