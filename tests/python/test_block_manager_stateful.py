"""Stateful property test of the Python BlockManager binding (hypothesis).

A reference model keeps each sequence's committed and reserved token values; a simulated KV
storage (one numpy array per model, one value per slot) is written through the slots the
manager returns, after applying its copy-on-write copies. After every step each live
sequence must read its own values back through the exported block tables (CSR and padded,
via the slot-mapping rule), and the page accounting must be exact.
"""

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import specd
from specd import errors

NUM_PAGES = 10
MODELS = [("target", 6), ("draft", 4)]  # page 24 bytes: 4 and 6 tokens per page


class BlockManagerMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.bm = specd.BlockManager(page_bytes=24, num_pages=NUM_PAGES, models=MODELS)
        self.bs = [self.bm.block_size(m) for m in range(len(MODELS))]
        self.storage = [np.zeros(NUM_PAGES * b, dtype=np.int64) for b in self.bs]
        self.ref = {}  # seq -> [(committed values, reserved values)] per model
        self.next_id = 0
        self.next_value = 1

    # ---- helpers ----
    def seqs(self):
        return sorted(self.ref)

    def write(self, seq, model, slots):
        values = np.arange(self.next_value, self.next_value + len(slots), dtype=np.int64)
        self.next_value += len(slots)
        self.storage[model][slots] = values
        self.ref[seq][model] = (self.ref[seq][model][0], list(values))

    def apply_copies(self, copies):
        for model, src, dst, n in copies.tolist():
            b = self.bs[model]
            self.storage[model][dst * b: dst * b + n] = self.storage[model][src * b: src * b + n]

    # ---- rules ----
    @rule()
    def add(self):
        self.bm.add_sequence(self.next_id)
        self.ref[self.next_id] = [([], []) for _ in MODELS]
        self.next_id += 1

    @precondition(lambda self: self.ref)
    @rule(data=st.data())
    def free(self, data):
        seq = data.draw(st.sampled_from(self.seqs()))
        self.bm.free_sequence(seq)
        del self.ref[seq]

    @precondition(lambda self: self.ref)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(self.seqs()))
        child = self.next_id
        self.next_id += 1
        if any(reserved for _, reserved in self.ref[parent]):
            try:
                self.bm.fork(parent, child)
                raise AssertionError("fork with reserved slots must fail")
            except errors.FailedPreconditionError:
                return
        self.bm.fork(parent, child)
        self.ref[child] = [(list(c), []) for c, _ in self.ref[parent]]

    @precondition(lambda self: self.ref)
    @rule(data=st.data(), model=st.integers(0, 1), n=st.integers(0, 13))
    def reserve(self, data, model, n):
        seq = data.draw(st.sampled_from(self.seqs()))
        before = self.bm.num_free_pages
        try:
            r = self.bm.reserve(seq, n, model=model)
        except errors.FailedPreconditionError:
            assert self.ref[seq][model][1], "only a pending reservation may block reserve"
            return
        except errors.OutOfPagesError:
            assert self.bm.num_free_pages == before
            return
        assert len(r.slots) == n
        self.apply_copies(r.copies)
        self.write(seq, model, r.slots)

    @precondition(lambda self: self.ref)
    @rule(data=st.data(), model=st.integers(0, 1))
    def commit(self, data, model):
        seq = data.draw(st.sampled_from(self.seqs()))
        committed, reserved = self.ref[seq][model]
        a = data.draw(st.integers(0, len(reserved)))
        self.bm.commit(seq, a, model=model)
        self.ref[seq][model] = (committed + reserved[:a], [])

    @precondition(lambda self: self.ref)
    @rule(data=st.data(), model=st.integers(0, 1))
    def rollback(self, data, model):
        seq = data.draw(st.sampled_from(self.seqs()))
        committed, _ = self.ref[seq][model]
        new_len = data.draw(st.integers(0, len(committed)))
        self.bm.rollback(seq, new_len, model=model)
        self.ref[seq][model] = (committed[:new_len], [])

    # ---- invariants ----
    @invariant()
    def internal_invariants_hold(self):
        self.bm.check_invariants()
        assert self.bm.num_sequences == len(self.ref)

    @invariant()
    def every_sequence_reads_back_its_values(self):
        seqs = self.seqs()
        for model, b in enumerate(self.bs):
            indptr, indices, last = self.bm.block_table_csr(seqs, model=model)
            table = self.bm.block_table_padded(seqs, model=model, pad=-1)
            lens = self.bm.kv_lens(seqs, model=model)
            used = set()
            for i, seq in enumerate(seqs):
                committed, reserved = self.ref[seq][model]
                want = committed + reserved
                assert lens[i] == len(want)
                pages = indices[indptr[i]:indptr[i + 1]]
                used.update(pages.tolist())
                assert list(table[i, :len(pages)]) == list(pages)
                if len(pages):
                    assert last[i] == len(want) - (len(pages) - 1) * b
                positions = np.arange(len(want), dtype=np.int32)
                slots = specd.slot_mapping(table, np.full(len(want), i, np.int32), positions, b,
                                           strict=True)
                assert self.storage[model][slots].tolist() == want
        all_pages = set()
        for model in range(len(MODELS)):
            for seq in seqs:
                all_pages.update(self.bm.pages(seq, model=model).tolist())
        assert self.bm.num_free_pages == NUM_PAGES - len(all_pages)


TestBlockManagerStateful = BlockManagerMachine.TestCase
TestBlockManagerStateful.settings = settings(
    max_examples=150, stateful_step_count=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
