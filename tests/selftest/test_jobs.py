"""The one-job-at-a-time mechanism the self-test and the A/B share (app/backend/jobs.py)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from app.backend.jobs import BackgroundJob, JobState


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
    assert job._launch(Progress(JobState.RUNNING), lambda: (seen.append(job._cancel.is_set()),
                                                             job._set(Progress(JobState.DONE)))[-1])
    assert job.wait(10).state is JobState.DONE
    assert seen == [False]  # a cancel before the launch does not cancel the new job
