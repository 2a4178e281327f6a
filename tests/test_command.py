"""`moet-panel command` equals the model card's three commands (run as the real CLI, in a subprocess)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections import Counter

import pytest

from app.backend.recipe import SIMULATED_RECIPE

# Profile 1, verbatim from the model card (docs/model-card.txt, "Profile 1 — max quality").
CARD_PROFILE_1 = r"""
docker run -d --name ds4-quality --gpus '"device=0"' --network host --ipc host --shm-size 32g \
  -v /data/ds4/DeepSeek-V4-Flash-0731:/model:ro \
  -v /data/ds4/planescache:/planescache \
  -v /data/ds4/moet_store:/store \
  -e VLLM_MOE_W2=1 \
  -e VLLM_MOE_W2_PLANES_CACHE=/planescache \
  -e VLLM_MOE_W2_STORE_DIR=/store \
  -e VLLM_MOE_W2_CKPT_ID=8863d864b7c75cde7493abc5899bdfe9e6dd16f6dab445961416f6e407c842b8 \
  -e VLLM_MOE_W2_DELTA_POLICY=freq \
  -e VLLM_MOE_W2_DELTA_GB=7 \
  -e VLLM_MOE_W2_GATE=0 \
  -e VLLM_MOE_W2_FORCE_POOL=1 \
  -e VLLM_MOE_W2_FORCE_RESIDENT=1 \
  -e VLLM_USE_BREAKABLE_CUDAGRAPH=0 \
  -e VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0 \
  -e PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
  vllm-moet-sm120:v026 \
  --model /model --served-model-name deepseek-v4-flash --trust-remote-code \
  --kv-cache-dtype fp8 --block-size 256 --max-model-len 262144 \
  --gpu-memory-utilization 0.99 --kv-cache-memory-bytes 2147483648 \
  --max-num-batched-tokens 1024 --max-num-seqs 1 \
  --tokenizer-mode deepseek_v4 --no-scheduler-reserve-full-isl \
  --compilation-config '{"cudagraph_mode":"FULL_AND_PIECEWISE","custom_ops":["all"]}' \
  --port 8000
"""
# Profile 2: "Take the profile-1 command and add one line:  -e VLLM_MOE_W2_PROMO_HYST=8"
CARD_PROFILE_2 = CARD_PROFILE_1.replace(
    "  vllm-moet-sm120:v026 \\\n", "  -e VLLM_MOE_W2_PROMO_HYST=8 \\\n  vllm-moet-sm120:v026 \\\n"
)
# Profile 3: "Take the profile-1 command and change one line: -e VLLM_MOE_W2_DELTA_POLICY=need"
CARD_PROFILE_3 = CARD_PROFILE_1.replace("VLLM_MOE_W2_DELTA_POLICY=freq", "VLLM_MOE_W2_DELTA_POLICY=need")
CARD = {"quality": CARD_PROFILE_1, "balanced": CARD_PROFILE_2, "speed": CARD_PROFILE_3}

DOCKER_OPTS_WITH_VALUE = {"--name", "--gpus", "--network", "--ipc", "--shm-size", "-v", "--label", "-e"}


def parse_docker_run(text: str) -> dict[str, object]:
    """Split a `docker run` into options (multiset), env (dict), image and engine args (ordered)."""
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    argv = shlex.split("\n".join(lines).replace("\\\n", " "))
    assert argv[:3] == ["docker", "run", "-d"], argv[:3]
    opts: list[tuple[str, str]] = []
    env: dict[str, str] = {}
    i = 3
    while argv[i].startswith("-"):
        opt = argv[i]
        assert opt in DOCKER_OPTS_WITH_VALUE, f"unexpected docker option {opt!r}"
        value = argv[i + 1]
        if opt == "-e":
            name, _, val = value.partition("=")
            assert name not in env, f"duplicate -e {name}"
            env[name] = val
        else:
            opts.append((opt, value))
        i += 2
    return {"opts": Counter(opts), "env": env, "image": argv[i], "args": argv[i + 1 :]}


def cli(*args: str) -> str:
    """The real CLI in a subprocess (what a user runs)."""
    proc = subprocess.run(
        [sys.executable, "-m", "app.cli.main", "command", *args], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def cli_inproc(*args: str) -> str:
    """The same entry point in-process (fast; used where a subprocess adds nothing)."""
    import contextlib
    import io

    from app.cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["command", *args]) == 0
    return out.getvalue()


@pytest.mark.parametrize("profile", ["quality", "balanced", "speed"])
def test_plain_command_equals_the_card(profile: str) -> None:
    got = parse_docker_run(cli("--profile", profile, "--plain", "--data-dir", "/data/ds4"))
    want = parse_docker_run(CARD[profile])
    assert got["opts"] == want["opts"]
    assert got["env"] == want["env"]  # order of -e may differ; names and values may not
    assert got["image"] == want["image"]
    assert got["args"] == want["args"]


def test_card_profiles_differ_by_exactly_one_line() -> None:
    p1, p2, p3 = (parse_docker_run(CARD[p])["env"] for p in ("quality", "balanced", "speed"))
    assert set(p2.items()) - set(p1.items()) == {("VLLM_MOE_W2_PROMO_HYST", "8")}
    assert set(p3.items()) ^ set(p1.items()) == {("VLLM_MOE_W2_DELTA_POLICY", "need"), ("VLLM_MOE_W2_DELTA_POLICY", "freq")}


SOCK_DIR = "/data/ds4/.moet-panel/engine-sock"
SOCK = f"{SOCK_DIR}/engine.sock"


@pytest.mark.parametrize("profile", ["quality", "balanced", "speed"])
def test_managed_command_adds_only_labels_name_trace_and_the_socket(profile: str) -> None:
    text = cli_inproc("--profile", profile, "--data-dir", "/data/ds4")
    got, want = parse_docker_run(text), parse_docker_run(CARD[profile])
    extra_opts = got["opts"] - want["opts"]
    missing_opts = want["opts"] - got["opts"]
    assert missing_opts == Counter({("--name", "ds4-quality"): 1})
    assert {o for o, _ in extra_opts} == {"--name", "--label", "-v"}
    # the socket's directory, at the same path inside the container; no -p: nothing is published
    assert [v for o, v in extra_opts if o == "-v"] == [f"{SOCK_DIR}:{SOCK_DIR}"]
    assert not any(o in ("-p", "--publish") for o, _ in got["opts"])
    labels = dict(v.split("=", 1) for o, v in extra_opts if o == "--label")
    assert labels["moet-panel.managed"] == "1" and labels["moet-panel.profile"] == profile
    assert all(k.startswith("moet-panel.") for k in labels)
    assert {k: v for k, v in got["env"].items() if k not in want["env"]} == {"VLLM_MOE_W2_DELTA_TRACE": "1"}
    assert {k: v for k, v in got["env"].items() if k in want["env"]} == want["env"]
    # the engine listens on a unix socket in the state dir (issue 40): the card's arguments plus `--uds PATH`
    assert "--host" not in want["args"] and "--uds" not in want["args"]
    assert got["image"] == want["image"] and got["args"] == want["args"] + ["--uds", SOCK]
    comments = [ln for ln in text.splitlines() if ln.startswith("#")]
    for needle in ("--name", "VLLM_MOE_W2_DELTA_TRACE=1", "--label", f"--uds {SOCK}", f"-v {SOCK_DIR}"):
        assert any(needle in c for c in comments), f"no comment line explains {needle}"


def test_simulated_recipe_adds_sim_decode_speed_with_a_comment() -> None:
    text = cli_inproc("--profile", "balanced", "--recipe", str(SIMULATED_RECIPE), "--data-dir", "/tmp/moet-demo")
    plain = parse_docker_run(cli_inproc("--profile", "balanced", "--recipe", str(SIMULATED_RECIPE), "--plain",
                                        "--data-dir", "/tmp/moet-demo"))
    got = parse_docker_run(text)
    added = {k: v for k, v in got["env"].items() if k not in plain["env"]}
    assert added == {"VLLM_MOE_W2_DELTA_TRACE": "1", "MOET_SIM_DECODE_TOK_S": "75"}
    assert any("MOET_SIM_DECODE_TOK_S" in ln for ln in text.splitlines() if ln.startswith("#"))
    assert dict(v.split("=", 1) for o, v in got["opts"] if o == "--label")["moet-panel.simulated"] == "1"


def test_json_format_parses_and_matches_shell() -> None:
    payload = json.loads(cli("--profile", "speed", "--format", "json", "--data-dir", "/data/ds4"))
    shell = parse_docker_run(cli_inproc("--profile", "speed", "--data-dir", "/data/ds4"))
    argv = payload["argv"]
    assert argv[:3] == ["docker", "run", "-d"]
    assert payload["image"] == shell["image"] == "vllm-moet-sm120:v026"
    assert dict(payload["env"])["VLLM_MOE_W2_DELTA_POLICY"] == "need"
    assert argv[argv.index(payload["image"]) + 1 :] == shell["args"]
    assert {a["option"].split()[0] for a in payload["additions"]} >= {"--name", "-e", "--label"}


def test_unknown_profile_and_unsafe_data_dir_exit_2() -> None:
    for extra in (["--profile", "nope"], ["--profile", "quality", "--data-dir", "/data/../etc"]):
        proc = subprocess.run(
            [sys.executable, "-m", "app.cli.main", "command", *extra], capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 2, proc.stdout
        assert proc.stderr.startswith("moet-panel: ")


def test_explain_prints_each_line_with_the_cards_reason(capsys) -> None:
    from app.cli.main import main

    assert main(["command", "--profile", "quality", "--explain"]) == 0
    out = capsys.readouterr().out.splitlines()
    i = out.index("  -e PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    assert out[i + 1].strip().startswith("↳ card: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True — removes ~0.5 GiB")
    j = out.index("  --max-num-seqs 1")
    assert "Concurrency multiplies the gate's fire floor" in out[j + 1]
    k = out.index("  --max-num-batched-tokens 1024")
    assert out[k + 1].strip() == "↳ (the card gives no reason for this line)"
    assert "VLLM_MOE_W2_DELTA_TRACE=1" in "\n".join(out) and "added by moet-panel" in "\n".join(out)


@pytest.mark.parametrize("profile", ["quality", "speed"])
def test_plain_is_the_cards_command_without_uds_and_explain_gives_the_sockets_reason(profile: str) -> None:
    plain = parse_docker_run(cli_inproc("--profile", profile, "--plain", "--data-dir", "/data/ds4"))
    assert plain == parse_docker_run(CARD[profile]) and "--host" not in plain["args"] and "--uds" not in plain["args"]
    explained = cli_inproc("--profile", profile, "--explain", "--data-dir", "/data/ds4")
    lines = explained.splitlines()
    i = next(n for n, ln in enumerate(lines) if ln.strip() == f"--uds {SOCK}")
    assert "added by moet-panel" in lines[i + 1] and "unix socket" in lines[i + 1] and "web page" in lines[i + 1]
    j = next(n for n, ln in enumerate(lines) if ln.strip() == f"-v {SOCK_DIR}:{SOCK_DIR}")
    assert "added by moet-panel" in lines[j + 1] and "0700" in lines[j + 1]
    k = next(n for n, ln in enumerate(lines) if ln.strip() == "--port 8000")
    assert "ignored" in lines[k + 1] and "--uds" in lines[k + 1]


def test_the_socket_addition_leaves_the_config_hash_as_it_was() -> None:
    """Self-test results are keyed by the config hash: where the engine listens (--uds and its mount, or
    --host 127.0.0.1 before it) must not make them stale."""
    import dataclasses

    from app.backend.recipe import load_recipe
    from app.backend.recipe.command import build_run_spec, config_hash

    recipe = load_recipe(SIMULATED_RECIPE)
    spec = build_run_spec(recipe, "quality", "/data/ds4")
    assert spec.args[-2:] == ("--uds", SOCK) and spec.socket_mount is not None
    assert spec.mounts[-1] == spec.socket_mount
    before = dataclasses.replace(spec, args=(*spec.args[:-2], "--host", "127.0.0.1"), mounts=spec.mounts[:-1],
                                 socket_mount=None)
    assert config_hash(spec) == config_hash(before)
    assert config_hash(dataclasses.replace(spec, args=(*spec.args[:-2], "--port", "9"))) != config_hash(spec)
