"""The whole upgrade journey in demo mode, from the CLI, on the real Docker (issue 45 "Done when"): build the
SIMULATED build `next`, serve it, self-test it, A/B it against the pin, promote it, roll back — and promote and
roll back each change what `moet-panel command --profile quality` prints and what the next start runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.backend.config.settings import resolve_settings
from app.cli.main import main

NEXT_IMAGE = "moet-panel/sim-engine:next"


@pytest.mark.slow
@pytest.mark.docker
def test_build_serve_measure_promote_rollback(docker_client, recipe_file: Path, sim_settings, sim_image, tmp_path,
                                              capsys, make_controller) -> None:
    common = ["--recipe", str(recipe_file), "--data-dir", str(sim_settings.data_dir), "--demo"]
    recipe_id = sim_settings.recipe.id

    def cli(*args: str) -> str:
        rc = main([*args, *common])
        out = capsys.readouterr()
        assert rc == 0, f"{args}: rc {rc}\n{out.out}\n{out.err}"
        return out.out

    def status() -> dict:
        return json.loads(cli("engine", "status", "--json"))["engine"]

    def command_image() -> str:
        return json.loads(cli("command", "--profile", "quality", "--format", "json"))["image"]

    try:
        # build: the SIMULATED variant, recorded as a build beside the pin
        assert "built SIMULATED build next" in cli("engine", "build-image", "--commit", "next")
        rows = {r["id"]: r for r in json.loads(cli("engine", "builds", "--json"))}
        assert rows["pin"]["current"] and rows["next"]["image"] == NEXT_IMAGE and rows["next"]["simulated"]
        assert command_image() == sim_image

        # serve: the pin, then the candidate; status names the build
        cli("engine", "start", "--profile", "quality")
        assert (status()["build"], status()["image"]) == ("pin", sim_image)
        cli("engine", "switch", "--profile", "quality", "--build", "next")
        eng = status()
        assert (eng["state"], eng["build"], eng["image"]) == ("ready", "next", NEXT_IMAGE)
        logs = cli("engine", "logs", "-n", "400")
        assert "moe_w2 EXL3 v2: FP4 need-pool staging" in logs  # the newer build's log form...
        trace = json.loads(cli("engine", "status", "--json"))["trace"]
        assert trace["understood"] is True  # ...which the panel reads
        # the candidate crashes: a panel's supervisor brings back the build that was asked for, not the current one
        sup = make_controller(settings=resolve_settings(recipe_file, sim_settings.data_dir), supervise=True)
        try:
            crashed = eng["container_id"]
            docker_client.containers.get(crashed).kill()
            back = sup.wait_for(lambda s: s.is_ready and s.container_id not in ("", crashed), 90)
            assert back.is_ready and back.build == "next", (back.state, back.build, back.message)
        finally:
            sup.close()

        # measure: a short self-test of the candidate, then an A/B pin vs candidate
        rc = main(["selftest", *common, "--profile", "quality", "--build", "next", "--runs", "1",
                   "--decode-tokens", "40", "--needle", "", "--ttft", "", "--json"])
        out = capsys.readouterr()
        assert rc == 0, out.err
        assert json.loads(out.out)["build"] == "next"
        assert main(["selftest", *common, "--profile", "quality", "--build", "pin", "--runs", "1"]) == 1
        assert "serves build next, not pin" in capsys.readouterr().err
        prompts = tmp_path / "p.jsonl"
        prompts.write_text('{"prompt": "Explain a B-tree split."}\n')
        rc = main(["abtest", *common, "run", "--a", "quality", "--b", "quality@next", "--prompts", str(prompts),
                   "--seeds", "1", "--max-tokens", "64"])
        assert rc == 0, capsys.readouterr().err
        capsys.readouterr()
        rows = {r["id"]: r for r in json.loads(cli("engine", "builds", "--json"))}
        runs = {b: sorted(e["kind"] for e in rows[b]["evidence"] if e["kind"] in ("abtest", "selftest"))
                for b in ("pin", "next")}
        assert runs == {"pin": ["abtest"], "next": ["abtest", "selftest"]}
        assert any(e["kind"] == "boot" for e in rows["next"]["evidence"])  # boot times, for the evidence page
        assert status()["build"] == "next"  # what it served before the A/B (the run switches back, issue 49)

        # promote from the pin: the engine switches to the candidate; command and the next start run it
        cli("engine", "switch", "--profile", "quality")
        assert status()["build"] == "pin"
        out = cli("engine", "promote", "next")
        assert "current build: next (was pin)" in out
        assert status()["build"] == "next" and command_image() == NEXT_IMAGE
        override = resolve_settings(recipe_file, sim_settings.data_dir).state_dir / f"engine-pin-{recipe_id}.json"
        promo = json.loads(override.read_text())["promotions"][-1]  # beside the recipe, in the state dir
        assert (promo["build"], promo["previous"], promo["who"]) == ("next", "pin", "cli")
        assert {"abtest", "selftest"} <= {e["kind"] for e in promo["evidence"]}
        cli("engine", "stop")
        cli("engine", "start", "--profile", "quality")
        assert (status()["build"], status()["image"]) == ("next", NEXT_IMAGE)

        # roll back: the pin serves again; command and the next start run it
        assert "current build: pin (was next)" in cli("engine", "rollback")
        assert status()["build"] == "pin" and command_image() == sim_image
        cli("engine", "stop")
        cli("engine", "start", "--profile", "quality")
        assert (status()["build"], status()["image"]) == ("pin", sim_image)
        assert json.loads(override.read_text())["promotions"] == []
    finally:
        for c in docker_client.containers.list(all=True, filters={"label": f"moet-panel.recipe={recipe_id}"}):
            c.remove(force=True)
