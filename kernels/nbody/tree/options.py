"""Compile options and constants shared by the octree's modules (Morton key layout, vector lanes)."""


# contract: allow fused multiply-add; no other fast-math. Every target's sums
# run in one fixed order through the same vector code (see _walk), so the
# result of a target does not depend on the other targets of the call.
_OPTS = dict(cache=True, nogil=True, fastmath={"contract"}, error_model="numpy")


_WORD_BITS = 21                 # bits per axis in each of the two 63-bit key words
_DEPTH = 2 * _WORD_BITS         # deepest level the keys resolve
_WORD_MASK = (1 << _WORD_BITS) - 1
_QMAX = float(1 << _DEPTH)      # quantised coordinates are in [0, 2**42)
_LANES = 16                     # targets evaluated together, one per vector lane
_DIRECT_COUNT = 2               # accepted nodes this small are summed body by body
