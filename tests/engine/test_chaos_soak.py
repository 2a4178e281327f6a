"""The chaos soak's short form (bench/chaos, issue 39 item 7): one of every fault, a fixed seed, against a demo
panel on the real Docker with the SIMULATED engine. The robust outcomes must hold: every healing fault restored,
no non-healing failure restarted, no clean outside stop fought, no answer cut by a switch. The time figures are
the bench's to print (`python -m bench.chaos`), not asserted here."""

from __future__ import annotations

import pytest

from bench.chaos.run import HEALING, KINDS, short_form, soak


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_chaos_short_form_keeps_serving(docker_client, sim_image) -> None:
    # the soak panel's restart backoff 2 s; each fault outlasts it: the restart meets Docker away, the port held, the
    # disk full; the outside stop and the non-healing start are watched past it (bench/chaos/run.py short_form)
    opts = short_form(len(KINDS), seed=11)
    report = soak(opts)
    print(report.table())
    covered = {k for k, s in report.stats.items() if s.cycles}
    assert covered == set(KINDS), f"faults not exercised: {set(KINDS) - covered} ({report.notes})"
    assert report.healing_failures() == [], "healing faults not restored:\n" + "\n".join(report.healing_failures())
    assert report.non_healing_restarts == 0
    assert report.fought == 0
    assert report.answers_cut == 0
    assert report.secrets_in_logs == 0, "a key, the notify URL's password or the HF token reached a log"
    assert all(report.stats[k].restored == report.stats[k].cycles for k in HEALING)


def test_schedule_is_seeded_and_covers_every_fault_first() -> None:
    from bench.chaos.run import schedule

    a = schedule(200, 1)
    assert a == schedule(200, 1) and a != schedule(200, 2)
    assert len(a) == 200 and set(a[:len(KINDS)]) == set(KINDS)
