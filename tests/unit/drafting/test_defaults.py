"""Which of an argument dump's values show a flag set: known flags, none of their defaults."""

from __future__ import annotations

from repromatrix.drafting.defaults import set_in_dump


def test_a_known_flag_off_every_default_of_it_is_set():
    assert set_in_dump("tensor_parallel_size", 2)
    assert set_in_dump("max_num_seqs", 512)
    assert not set_in_dump("max_num_seqs", 256)  # V0's default
    assert not set_in_dump("max_num_seqs", None)  # V1's
    assert not set_in_dump("gpu_memory_utilization", 0.92)


def test_true_is_no_default_of_one_and_an_unknown_flag_is_never_set():
    assert set_in_dump("tensor_parallel_size", True)
    assert set_in_dump("trust_remote_code", True)
    assert not set_in_dump("trust_remote_code", False)
    assert not set_in_dump("response_role", "assistant")  # its default is not known here
