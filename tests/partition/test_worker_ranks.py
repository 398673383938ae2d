"""A worker's ranks: a rank whose wait passes its timeout aborts its peers, and the client's abort reaches them."""

import time

import pytest

pytest.importorskip("distributed")  # a bare GPU image lacks it: skip there

from hpcgpu.cluster import worker_info  # noqa: E402
from hpcgpu.errors import CommAborted, CommTimeout  # noqa: E402
from hpcgpu.partition.dask_communicator import communicator  # noqa: E402
from hpcgpu.partition.dask_session import close_session, open_session  # noqa: E402
from hpcgpu.partition.worker_ranks import aborting_on_failure, raise_root_cause, run_ranks  # noqa: E402


def _guarded_rank(session, rank):
    """Rank 0 waits 0.5 s for a message never sent; rank 1 waits 60 s for one from rank 0, which never comes."""
    comm = communicator(session, rank)
    started = time.monotonic()
    try:
        with aborting_on_failure(session, rank, current_comm=lambda: comm):
            comm.recv(1 - rank, "never", timeout=0.5 if rank == 0 else 60)
    except (CommTimeout, CommAborted) as error:
        return type(error).__name__, str(error), time.monotonic() - started
    return "received", "", time.monotonic() - started


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "dask"])
def test_a_rank_whose_wait_times_out_aborts_its_peers(client, direct):
    session = open_session(client, sorted(worker_info(client)), timeout=60, direct=direct)
    try:
        futures = [client.submit(_guarded_rank, session, rank, workers=[address], allow_other_workers=False,
                                 pure=False) for rank, address in enumerate(session.addresses)]
        (kind0, message0, _), (kind1, message1, waited1) = client.gather(futures)
    finally:
        close_session(client, session)
    assert kind0 == "CommTimeout" and "rank 0" in message0
    # rank 1 was released by rank 0's abort, not by its own 60 s timeout
    assert kind1 == "CommAborted" and "rank 0 aborted: CommTimeout" in message1, message1
    assert waited1 < 10


def test_run_ranks_raises_the_rank_own_error_before_the_aborts_it_caused():
    def one(k):
        if k == 0:
            raise CommAborted("rank 0: the run was aborted", rank=0)
        raise CommTimeout("rank 1: no completion of a message from rank 0", rank=1)

    with pytest.raises(CommTimeout, match="rank 1"):
        run_ranks([0, 1], one)
    with pytest.raises(CommTimeout):
        raise_root_cause([CommAborted("aborted"), CommTimeout("timed out")])
