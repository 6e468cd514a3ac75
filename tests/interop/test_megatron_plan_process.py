"""The planning process of the Megatron integration's ``prefetch=1`` without Megatron: ``serve``
answers each pickled job, in order, with the groups ``plan_lengths`` gives or the exception it
raised, stops at the end of the jobs or when the answers' reader is gone; run as
``python -m seqpack.interop.megatron_plan JOBS_FD ANSWERS_FD`` on two pipes, as
seqpack.interop.megatron starts it."""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from seqpack.errors import ScheduleError
from seqpack.interop.megatron_plan import plan_lengths, serve

SIZES = dict(max_seqlen_per_dp_cp_rank=100, cp_size=1, dp_size=2)
GOOD = (np.array([30, 70, 20, 50, 90, 10], dtype=np.int64), {"microbatch_multiple": 1}, SIZES)
BAD = (np.array([10, 20, 30], dtype=np.int64), {"microbatch_multiple": 4}, SIZES)  # 3 cannot fill 4 x 2


def _jobs(*jobs):
    stream = io.BytesIO()
    for job in jobs:
        pickle.dump(job, stream)
    stream.seek(0)
    return stream


def _answers(data):
    stream, out = io.BytesIO(data), []
    while stream.tell() < len(data):
        out.append(pickle.load(stream))
    return out


def test_each_job_is_answered_in_order_with_its_groups_or_its_error():
    answers = io.BytesIO()
    serve(_jobs(GOOD, BAD, GOOD[:2] + ({**SIZES, "dp_size": 1},)), answers)
    first, second, third = _answers(answers.getvalue())
    assert first == (True, plan_lengths(GOOD[0], GOOD[1], **SIZES))
    assert second[0] is False and isinstance(second[1], ScheduleError)
    assert "3 sequences cannot fill 4 microbatches" in str(second[1])
    assert third == (True, plan_lengths(GOOD[0], GOOD[1], **{**SIZES, "dp_size": 1}))
    assert third != first  # each job planned with its own sizes


def test_serving_stops_when_the_training_process_is_gone():
    class Gone(io.BytesIO):
        def write(self, data):
            raise BrokenPipeError(32, "Broken pipe")

    jobs = _jobs(GOOD, GOOD, GOOD)
    serve(jobs, Gone())  # returns instead of raising
    one = len(pickle.dumps(GOOD))
    assert jobs.tell() == one  # no job read after the answer could not be written
    serve(_jobs(), io.BytesIO())  # no jobs: returns at once


@pytest.mark.processes
def test_the_planning_process_answers_on_its_pipes_until_the_jobs_end():
    jobs_out, jobs_in = os.pipe()
    answers_out, answers_in = os.pipe()
    command = [sys.executable, "-m", "seqpack.interop.megatron_plan", str(jobs_out), str(answers_in)]
    process = subprocess.Popen(command, pass_fds=(jobs_out, answers_in), stdin=subprocess.DEVNULL)
    os.close(jobs_out)
    os.close(answers_in)
    with os.fdopen(jobs_in, "wb") as jobs, os.fdopen(answers_out, "rb") as answers:
        try:
            for job in (GOOD, BAD):
                pickle.dump(job, jobs)
                jobs.flush()
            assert pickle.load(answers) == (True, plan_lengths(GOOD[0], GOOD[1], **SIZES))
            planned, error = pickle.load(answers)
            assert not planned and isinstance(error, ScheduleError)
            jobs.close()  # the training process closes its end: the planner ends
            assert process.wait(timeout=60) == 0
            assert answers.read() == b""
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
