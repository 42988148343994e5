"""The shared-weights seqlock under a concurrent writer and reader: no torn read, no going back."""

import multiprocessing as mp
import os
import queue
import random
import time

import torch
import torch.multiprocessing  # noqa: F401  (shared-memory tensors pickle by handle)
from torch import nn

from maze_cli.parallel.shared_weights import SharedWeights
from maze_cli.start_methods import default_start_method

N_PULLS = 1000


def make_module() -> nn.Module:
    """Several tensors of about 4 MB in all: copying them takes long enough for a write to overlap."""
    return nn.Sequential(nn.Linear(512, 512), nn.Linear(512, 512), nn.Linear(512, 512), nn.Linear(512, 512))


def filled(module: nn.Module, value: float) -> dict[str, torch.Tensor]:
    return {k: torch.full_like(v, value) for k, v in module.state_dict().items()}


def pull_many(weights: SharedWeights, started, results) -> None:
    """The reader: pull `N_PULLS` times; report each pull's version and the values it found."""
    torch.set_num_threads(1)
    module = make_module()
    started.set()
    pulls = []
    for _ in range(N_PULLS):
        version = weights.pull(module)
        values = sorted({float(t.min()) for t in module.state_dict().values()} | {float(t.max()) for t in module.state_dict().values()})
        pulls.append((version, values))
    results.put(pulls)


def test_a_reader_in_another_process_never_sees_a_torn_or_older_version():
    module = make_module()
    weights = SharedWeights(module)
    assert weights.publish(filled(module, 1.0)) == 1  # from here on, version v has every value == v
    ctx = mp.get_context(default_start_method())
    started, results = ctx.Event(), ctx.Queue()
    reader = ctx.Process(target=pull_many, args=(weights, started, results), daemon=True)
    reader.start()
    try:
        assert started.wait(60), "the reader process did not start"
        # The writer (the learner's role: this process, the only writer) publishes version v with
        # every tensor holding v until the reader is done. Its pauses, random and at times longer
        # than a copy, let a reader's copy complete between two writes now and then.
        pulls, deadline = None, time.monotonic() + 120
        while pulls is None and time.monotonic() < deadline:
            version = weights.version + 1
            assert weights.publish(filled(module, float(version))) == version
            time.sleep(random.uniform(0.0, 0.003))
            try:
                pulls = results.get_nowait()
            except queue.Empty:
                pass
        assert pulls is not None, "the reader did not finish its pulls within 120 s"
        reader.join(timeout=30)
        assert reader.exitcode == 0
    finally:
        if reader.is_alive():
            reader.kill()
    torn = [(v, values) for v, values in pulls if values != [float(v)]]
    assert not torn, f"{len(torn)} of {len(pulls)} pulls mixed versions or disagreed with the version returned: {torn[:3]}"
    versions = [v for v, _ in pulls]
    assert all(a <= b for a, b in zip(versions, versions[1:])), "a pull returned an older version than the one before"
    assert len(set(versions)) >= 20, "the writer and the reader hardly overlapped: the test proved nothing"


def killed_writer(weights: SharedWeights, report) -> None:
    """Fault injection: a writer that starts a reader, then dies in the middle of a publish (the
    counter left odd), as a learner SIGKILLed while it copies the weights in."""
    ctx = mp.get_context("spawn")
    ctx.Process(target=pull_after_the_writer_died, args=(weights, report), daemon=False).start()
    weights._sequence += 1  # a publish begun, never finished
    os._exit(0)


def pull_after_the_writer_died(weights: SharedWeights, report) -> None:
    try:
        weights.pull(make_module())
        report.send("pulled")
    except RuntimeError as err:
        report.send(str(err))


def test_a_reader_whose_writer_died_mid_publish_gives_up_instead_of_spinning():
    """Else an actor of a SIGKILLed learner would spin forever at a full core, left behind."""
    weights = SharedWeights(make_module())
    ctx = mp.get_context("spawn")  # the writer starts the reader: no forkserver of its own to leave behind
    receive, report = ctx.Pipe(duplex=False)
    writer = ctx.Process(target=killed_writer, args=(weights, report))
    writer.start()
    writer.join(timeout=60)
    assert receive.poll(30), "the reader still spins 30 s after its writer died"
    assert receive.recv() == "the learner died while publishing weights"
