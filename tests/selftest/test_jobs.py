"""The one-job-at-a-time mechanism the self-test, the A/B and the downloads share (app/backend/jobs.py)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from app.backend.jobs import BackgroundJob, JobState, SingleFlight, StopSignal
from tests.polling import wait_for


@dataclass(frozen=True)
class Progress:
    state: JobState = JobState.IDLE
    who: int = -1


def test_concurrent_launches_start_exactly_one_job() -> None:
    job: BackgroundJob[Progress] = BackgroundJob(Progress(), "test-job")
    release = threading.Event()
    ran: list[int] = []
    barrier = threading.Barrier(8)
    results: list[bool] = []

    def body(i: int) -> None:
        ran.append(i)
        release.wait(30)
        job._set(Progress(JobState.DONE, i))

    def launch(i: int) -> None:
        barrier.wait(10)  # all eight try at the same moment (a double click, two tabs)
        results.append(job._launch(Progress(JobState.RUNNING, i), lambda: body(i)))

    threads = [threading.Thread(target=launch, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    try:
        assert sorted(results) == [False] * 7 + [True]
        assert job.running()
    finally:
        release.set()
    done = job.wait(10)
    assert done.state is JobState.DONE and ran == [done.who]


def test_a_finished_job_can_be_launched_again_and_cancel_is_cleared() -> None:
    job: BackgroundJob[Progress] = BackgroundJob(Progress(), "test-job")
    job.cancel()
    seen: list[bool] = []
    assert job._launch(Progress(JobState.RUNNING), lambda: (seen.append(job._stop.is_set()),
                                                             job._set(Progress(JobState.DONE)))[-1])
    assert job.wait(10).state is JobState.DONE
    assert seen == [False]  # a cancel before the launch does not cancel the new job


def test_single_flight_busy_while_its_thread_lives_pause_or_cancel_and_a_fresh_stop_each_launch() -> None:
    """The downloads' runner: busy while the thread lives (no progress value), Pause and Cancel told apart,
    and a stop asked of one run never reaches the next."""
    flight = SingleFlight("test-flight")
    seen: list[StopSignal] = []
    setups: list[int] = []

    def body(stop: StopSignal) -> None:
        seen.append(stop)
        stop.wait(30)

    assert not flight.stop_and_join(cancel=False, timeout=1), "nothing runs: nothing to stop"
    assert flight.launch(body, lambda _: setups.append(1)) and not flight.launch(body, lambda _: setups.append(2))
    assert setups == [1], "a refused launch sets nothing up"
    wait_for(lambda: seen)
    assert flight.alive() and flight.stop_and_join(cancel=False, timeout=10) and not flight.alive()
    assert seen[0].is_set() and not seen[0].cancelled  # paused
    assert flight.launch(body)
    wait_for(lambda: len(seen) == 2)
    assert seen[1] is not seen[0] and not seen[1].is_set()
    assert flight.stop_and_join(cancel=True, timeout=10) and seen[1].cancelled
