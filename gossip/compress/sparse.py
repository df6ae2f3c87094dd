"""Sparsifiers: top-k (largest magnitudes) and rand-k (uniform coordinates, seed on the wire)."""

from __future__ import annotations

import functools
import math
import threading
from abc import abstractmethod
from collections import OrderedDict
from typing import Any, ClassVar

import numpy as np
import torch

from gossip.compress import bits, dispatch, jit
from gossip.compress import rows as _rows
from gossip.compress.base import Compressor
from gossip.compress.checks import all_finite, no_grad, nonfinite
from gossip.compress.codec import Codec
from gossip.compress.wire import Sections, numel_of
from gossip.errors import CompressionError

_INT32_MAX = (1 << 31) - 1
#: the integer view of a float dtype and the non-sign bits in it (top-k's numba kernel)
_BITS_OF = {np.float32: np.int32, np.float64: np.int64}
_MAG = {np.float32: np.int32(0x7FFFFFFF), np.float64: np.int64(0x7FFFFFFFFFFFFFFF)}


class _KSparse(Codec):
    """Shared size logic: ``k = K`` or ``max(1, ⌊ratio·d⌋)``, checked against d."""

    def __init__(self, spec: str, ratio: float | None = None, k: int | None = None) -> None:
        super().__init__(spec)
        if (ratio is None) == (k is None):
            raise CompressionError(f"{spec}: give exactly one of ratio and k, got ratio={ratio}, k={k} "
                                   "(e.g. topk:0.1 for a ratio, topk:10 for k)")
        self.ratio, self.k = ratio, k

    @abstractmethod
    def _encode_batch(self, X: torch.Tensor, rng: Any, v: dict[str, torch.Tensor]) -> None:
        ...

    @abstractmethod
    def _rows_indices(self, v: dict[str, torch.Tensor], d: int) -> torch.Tensor:
        """The [m, k] kept indices (int64, increasing in each row) of the bodies ``v``."""
        ...

    def _decode_batch(self, v: dict[str, torch.Tensor], out: torch.Tensor) -> None:
        out.zero_()
        out.scatter_(1, self._rows_indices(v, out.shape[1]).to(out.device), v["values"])

    @abstractmethod
    def _sel_host(self, host: dict[str, Any], d: int) -> np.ndarray:
        """The kept indices of a host-path payload (cached in ``host``)."""
        ...

    def _decode_host(self, host, out: np.ndarray) -> None:
        out.fill(0)
        out[self._sel_host(host, out.size)] = host["values"]

    def _decode_add_host(self, host, out: np.ndarray, weight: float) -> None:
        vals = host["values"]
        out[self._sel_host(host, out.size)] += vals if weight == 1.0 else vals * weight

    def _start_rows_decode(self, out, block, weight, rows, check):
        """:func:`~gossip.compress.rows.start_decode` plus the [m, k] values section: (plan,
        block, targets, weights, bad rows, values), or None for the default loop."""
        st = _rows.start_decode(self, out, block, weight, rows, check)
        if st is None:
            return None
        return (*st, _rows.section(st[1], st[0], "values"))

    @staticmethod
    def _add_selected_rows(out: torch.Tensor, tgt: torch.Tensor, sel: torch.Tensor,
                           vals: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
        """``out[tgt[r], sel[r]] += w[r]·vals[r]`` row after row (``sel`` [m, k]: the wire's
        int32 indices, left as they are, or int64 ones, which may be overwritten; a row's
        indices distinct), with a single message's rounding."""
        m, d = vals.shape[0], out.shape[1]
        if dispatch.numpy_writable(out):
            # numpy's unbuffered add.at adds in index order (a repeated target row adds in row
            # order), as a serial index_add_ does, with a third of torch's per-call cost
            on, vn = out.numpy().reshape(-1), vals.numpy()
            add = vn if w is None else vn * w.numpy().astype(vn.dtype).reshape(m, 1)
            if dispatch.loop_rows(d):  # long rows: a gather, add and scatter per row (a row's
                o2, sn = out.numpy(), sel.numpy()  # indices are distinct), ~10x add.at
                for r, t in enumerate(tgt.tolist()):
                    o2[t, sn[r]] += add[r]
                return out
            flat = sel.numpy() + (tgt.numpy() * d).reshape(m, 1)  # int64 flat positions
            np.add.at(on, flat.reshape(-1), add.reshape(-1))
            return out
        sel = sel.long()  # (the wire's int32 indices: a copy, so adding to it is safe)
        if out.is_contiguous():  # one serial index_add_: a repeated target row adds in order
            add = vals if w is None else vals * w.to(out.dtype)  # w·v rounded, then added
            flat = sel.add_(tgt.view(m, 1) * d)
            out.view(-1).index_add_(0, flat.view(-1), add.reshape(-1))
            return out
        # rows of a larger tensor: a gather-add-scatter per level of distinct targets. A single
        # message rounds w·v first into a contiguous row (index_add_), but adds its dense decode
        # with add_(alpha=w) into a strided one (w·v + out rounded once: addcmul here)
        fused = out.stride(1) != 1
        for level in _rows.levels(tgt):
            t = (tgt if level is None else tgt[level]).view(-1, 1)
            s_ = sel if level is None else sel[level]
            v = vals if level is None else vals[level]
            cur = out[t, s_]
            if w is None:
                cur.add_(v)
            elif fused:
                cur.addcmul_(v, (w if level is None else w[level]).to(out.dtype))
            else:
                cur.add_(v * (w if level is None else w[level]).to(out.dtype))
            out[t, s_] = cur
        return out

    def k_for(self, d: int) -> int:
        """Entries kept for a tensor of ``d`` entries (raises when k > d)."""
        k = self.k if self.k is not None else max(1, int(self.ratio * d))
        if k > d:
            raise CompressionError(
                f"{self.spec}: k = {k} exceeds the tensor's d = {d} entries; use a ratio "
                f"(e.g. '{self.spec.split(':')[0]}:0.01') or k <= d"
            )
        return k


class TopK(_KSparse):
    """Keep the k entries of largest |x_i| (exactly k; ties broken by the lowest index).

    Biased, contractive: ‖C(x) − x‖² ≤ (1 − k/d)‖x‖², δ = k/d. Idempotent.
    Wire: k values (input dtype) in increasing index order, then either k int32 indices
    (``8 + k·itemsize + 4k`` bytes) or a d-bit bitmap (``8 + k·itemsize + ⌈d/8⌉``), whichever
    is smaller (the bitmap once k > d/32). The header parameter says which.

    Selection: a strided sample of |x| estimates the k-th largest magnitude; every entry above
    a slightly lower threshold becomes a candidate (if fewer than k, fall back to all entries);
    the exact k-th largest value ``t`` of the candidates is the global one, and the set is
    ``{|x_i| > t}`` plus the lowest-index entries with ``|x_i| = t``. That is exactly
    ``torch.topk``'s set on tie-free data, deterministic on ties, and cheaper on CPU (one
    exact selection among a few candidates instead of all d entries).
    On CUDA the candidate count is read on the host (one sync), as is the NaN/Inf check.
    On CPU with numba the candidates come from one pass over x's bits
    (:mod:`gossip.compress.jit`, ``topk_candidates``: no |x| array, no mask; NaN/Inf found on
    the way), about 2× faster at d = 10⁶ than the numpy passes, which remain the fallback.
    """

    ordered_rows: ClassVar[bool] = True
    kind: ClassVar[int] = 4
    param_name: ClassVar[str] = "index format (0 = int32 indices, 1 = bitmap)"
    sample_size: ClassVar[int] = 16384  # entries in the threshold-estimating sample (at most)
    sample_min_d: ClassVar[int] = 4096  # below this, select among all entries

    def __init__(self, spec: str, ratio: float | None = None, k: int | None = None) -> None:
        super().__init__(spec, ratio, k)
        self.delta = ratio

    def delta_for(self, numel: int) -> float | None:
        return self.k_for(numel) / numel

    @staticmethod
    def uses_bitmap(d: int, k: int) -> bool:
        return bits.nbytes_bits(d) < 4 * k

    def param_for(self, shape: tuple[int, ...]) -> int:
        d = numel_of(shape)
        return int(self.uses_bitmap(d, self.k_for(d)))

    def _sections(self, shape, dtype) -> Sections:
        d = numel_of(shape)
        k = self.k_for(d)
        if self.uses_bitmap(d, k):
            return Sections.build(
                ("values", dtype, k), ("bitmap", torch.uint8, bits.nbytes_bits(d))
            )
        if d > _INT32_MAX:
            raise CompressionError(f"{self.spec}: d = {d} does not fit int32 indices")
        return Sections.build(("values", dtype, k), ("index", torch.int32, k))

    def _encode_batch(self, X: torch.Tensor, rng: Any, v: dict[str, torch.Tensor]) -> None:
        """Each row's top-k set: a single row by :meth:`select` (a sampled threshold, then one
        exact selection among a few candidates: cheap on long rows), a block by one batched
        ``torch.topk`` of k + 1 keys per row (:meth:`_top_rows`); then the values in
        increasing index order and the indices or the bitmap (:func:`_write_rows`)."""
        m, d = X.shape
        k = v["values"].shape[1]
        if m == 1:
            a = torch.abs(X[0], out=self.ws.get("abs", d, X.dtype, X.device))
            sel = self.select(a, k).view(1, k)
        elif k == d:
            sel = torch.arange(d, device=X.device).expand(m, d)
        else:
            A = _order_key(torch.abs(X, out=_rows.scratch(self, "abs", (m, d), X.dtype, X.device)))
            tv, ti = torch.topk(A, k + 1, dim=1, sorted=True)
            sel = ti[:, :k].sort(1).values
            _resolve_row_ties(A, sel, (tv[:, k - 1] == tv[:, k]).nonzero().view(-1), tv[:, k - 1], k)
        _write_rows(X, sel, v)

    def _check_batch(self, v: dict[str, torch.Tensor], d: int) -> None:
        bad = self._bad_rows(v, d, torch.zeros(v["values"].shape[0], dtype=torch.bool,
                                               device=v["values"].device))
        r = _rows.first(bad)
        if r is not None:
            if "index" in v:
                idx = v["index"][r]
                lo, hi = int(idx.amin()), int(idx.amax())
                if lo < 0 or hi >= d:
                    raise CompressionError(
                        f"{self.spec}: index out of range: indices span [{lo}, {hi}] but d = {d}")
                raise CompressionError(
                    f"{self.spec}: indices are not strictly increasing (duplicates or unsorted)")
            ones = int(_rows.popcount_rows(v["bitmap"][r : r + 1])[0])
            k = v["values"].shape[1]
            if ones != k:
                raise CompressionError(f"{self.spec}: bitmap has {ones} set bits, expected k = {k}")
            raise CompressionError(f"{self.spec}: bitmap sets bits past d = {d}")

    def _bad_rows(self, v: dict[str, torch.Tensor], d: int, bad: torch.Tensor) -> torch.Tensor:
        """``bad`` OR the rows whose indices leave [0, d) or do not increase, or whose bitmap
        does not set exactly k of its first d bits."""
        k = v["values"].shape[1]
        if "index" in v:
            idx = v["index"]
            bad = bad | (idx.amin(1) < 0) | (idx.amax(1) >= d)
            if k > 1:
                bad |= (idx[:, 1:] <= idx[:, :-1]).any(1)
            return bad
        bm = v["bitmap"]
        bad = bad | (_rows.popcount_rows(bm) != k)
        if d % 8:
            bad |= (bm[:, -1] >> (d % 8)) != 0
        return bad

    def _rows_indices(self, v: dict[str, torch.Tensor], d: int) -> torch.Tensor:
        if "index" in v:
            return v["index"].long()
        return _bitmap_indices(v["bitmap"], d, v["values"].shape[1])

    def select(self, a: torch.Tensor, k: int) -> torch.Tensor:
        """Sorted int64 indices of the top-k of ``a`` (≥ 0), lowest index first among ties."""
        d = a.numel()
        if k == d:
            return torch.arange(d, device=a.device)
        cand = None
        if d >= self.sample_min_d and 8 * k <= d:
            sample = a[:: max(8, d // self.sample_size)]
            ns = sample.numel()
            mean = ns * k / d
            j = min(ns, math.ceil(mean + 4.0 * math.sqrt(mean) + 2.0))
            idx = self._indices_ge(a, torch.topk(sample, j, sorted=False).values.min())
            if idx.numel() >= k:  # else the sample was unlucky (or adversarial): fall back
                cand = idx
        if cand is None:
            t = torch.topk(a, k, sorted=False).values.min()
            cand = self._indices_ge(a, t)
            ca = a[cand]
        else:
            ca = a[cand]
            t = torch.kthvalue(ca, ca.numel() - k + 1).values
        # cand ⊇ {a ≥ t}, in increasing index order: take every a > t, then the first ties
        gt = ca > t
        eq = ca == t
        keep = gt | (eq & (eq.cumsum(0) <= k - gt.sum()))
        return cand[keep.nonzero().view(-1)]

    def _indices_ge(self, a: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Increasing int64 indices of ``a >= t`` (host sync on CUDA: variable size)."""
        mask = self.ws.get("mask", a.numel(), torch.bool, a.device)
        if dispatch.numpy_path(a.device, a.dtype):  # numpy's greater_equal/flatnonzero beat torch's
            np.greater_equal(a.numpy(), float(t), out=mask.numpy())
            return torch.from_numpy(np.flatnonzero(mask.numpy()))
        torch.ge(a, t, out=mask)
        return mask.nonzero().view(-1)

    # ------------------------------------------------------- numpy fast path (CPU)
    def _encode_host(self, plan, x, xn, generator, v) -> dict[str, Any]:
        d, k = xn.size, v["values"].size
        sel = self._select_jit(xn, k)
        if sel is None:
            a = self.ws.host("abs", d, x.dtype)
            np.abs(xn, out=a)
            sel = self._select_host(a, k)
        np.take(xn, sel, out=v["values"])
        if "index" in v:
            v["index"][:] = sel
        else:
            flags = self.ws.host("flags", d, torch.bool)
            flags.fill(False)
            flags[sel] = True
            v["bitmap"][:] = np.packbits(flags, bitorder="little")
        v["sel"] = sel
        return v

    def _sample_threshold(self, sample: np.ndarray, d: int, k: int):
        """From ``sample`` (|x| at a stride of :meth:`_stride`), a value a little below the
        k-th largest of all d: ``{|x_i| ≥ it}`` holds the top k with high probability."""
        ns = sample.size
        mean = ns * k / d
        j = min(ns, math.ceil(mean + 4.0 * math.sqrt(mean) + 2.0))
        return np.partition(sample, ns - j)[ns - j]

    def _stride(self, d: int) -> int:
        """The stride of the threshold-estimating sample (at most ``sample_size`` entries)."""
        return max(8, d // self.sample_size)

    def _select_jit(self, xn: np.ndarray, k: int) -> np.ndarray | None:
        """:meth:`_select_host`'s set from ``x`` itself, by the numba kernel
        ``topk_candidates`` (:mod:`.jit`): one pass over x's bits collects the candidates
        ``|x_i| ≥`` the sampled threshold and finds NaN/Inf, with no ``|x|`` or mask array;
        then the exact selection among the candidates. None where it does not serve (no
        numba, short or dense selections, an unlucky sample, NaN/Inf with the check off): the
        caller takes the numpy path."""
        d = xn.size
        if d < self.sample_min_d or 8 * k > d or xn.dtype.type not in _BITS_OF:
            return None
        fn = dispatch.jit_kernel("topk_candidates")
        if fn is None:
            return None
        ints = xn.view(_BITS_OF[xn.dtype.type])
        t = self._sample_threshold(np.abs(xn[:: self._stride(d)]), d, k)
        if not math.isfinite(t):  # NaN/Inf in the sample
            if self.check_finite:
                raise nonfinite(self.spec)
            return None
        idx = self.ws.host("topk.cand", d + 8, torch.int64)
        flags = self.ws.host("topk.flags", jit.TOPK_CHUNK, torch.bool)
        c = fn(ints, t.view(ints.dtype), _MAG[xn.dtype.type], idx, flags, *jit.BYTE_POSITIONS)
        cand = idx[:c]
        ca = np.abs(xn[cand])
        if c and not math.isfinite(ca.max()):  # every NaN/Inf of x is a candidate
            if self.check_finite:
                raise nonfinite(self.spec)
            return None
        if c < k:  # the sample was unlucky (or adversarial)
            return None
        sel = np.empty(k, np.int64)
        dispatch.jit_kernel("topk_keep")(cand, ca, np.partition(ca, c - k)[c - k], k, sel)
        return sel

    def _select_host(self, a: np.ndarray, k: int) -> np.ndarray:
        """numpy twin of :meth:`select` (same set; raises on NaN/Inf when ``check_finite``).

        Below ``sample_min_d`` one ``np.partition`` finds the k-th largest value t; the set is
        then read off ``a >= t`` (ties resolved only when there are more than k candidates).
        """
        d = a.size
        if d >= self.sample_min_d and 8 * k <= d:
            if self.check_finite and not math.isfinite(a.max()):  # max propagates NaN
                raise nonfinite(self.spec)
            cand = self._ge_host(a, self._sample_threshold(a[:: self._stride(d)], d, k))
            if cand.size >= k:
                ca = a[cand]
                return _resolve_ties(cand, ca, np.partition(ca, ca.size - k)[ca.size - k], k)
            # the sample was unlucky (or adversarial): the exact threshold from all entries
            t = torch.topk(torch.from_numpy(a), k, sorted=False).values.min().item()
        elif k == d:
            if self.check_finite and not math.isfinite(a.max()):
                raise nonfinite(self.spec)
            return np.arange(d, dtype=np.int64)
        else:
            top = np.partition(a, d - k)[d - k :]  # NaN sorts last: NaN/Inf land in here
            if self.check_finite and not math.isfinite(top.max()):
                raise nonfinite(self.spec)
            t = top[0]
        cand = self._ge_host(a, t)
        if cand.size == k:
            return cand
        if cand.size < k:  # t is NaN (only with check_finite off): any k entries, no crash
            return np.sort(np.argpartition(a, d - k)[d - k :])
        return _resolve_ties(cand, a[cand], t, k)

    def _ge_host(self, a: np.ndarray, t) -> np.ndarray:
        """Increasing int64 indices of ``a >= t``."""
        mask = self.ws.host("mask", a.size, torch.bool)
        np.greater_equal(a, t, out=mask)
        return np.nonzero(mask)[0]

    def _parse_host(self, v, d: int) -> dict[str, Any]:
        k = v["values"].size
        if "index" in v:
            idx = v["index"]
            inc = k == 1 or bool((idx[1:] > idx[:-1]).all())
            lo, hi = (int(idx[0]), int(idx[-1])) if inc else (int(idx.min()), int(idx.max()))
            if lo < 0 or hi >= d:
                raise CompressionError(
                    f"{self.spec}: index out of range: indices span [{lo}, {hi}] but d = {d}"
                )
            if not inc:
                raise CompressionError(
                    f"{self.spec}: indices are not strictly increasing (duplicates or unsorted)"
                )
            v["sel"] = idx
        else:
            bm = v["bitmap"]
            ones = bits.popcount_np(bm)
            if ones != k:
                raise CompressionError(f"{self.spec}: bitmap has {ones} set bits, expected k = {k}")
            tail = d % 8
            if tail and int(bm[-1]) >> tail:
                raise CompressionError(f"{self.spec}: bitmap sets bits past d = {d}")
        return v

    def _sel_host(self, host: dict[str, Any], d: int) -> np.ndarray:
        sel = host.get("sel")
        if sel is None:
            flags = np.unpackbits(host["bitmap"], count=d, bitorder="little")
            sel = host["sel"] = np.flatnonzero(flags.view(bool))  # nonzero is cheaper on bool
        return sel

    # ----------------------------------------------------- blocks of nodes (rows)
    @no_grad
    def _fast_encode_rows(self, X, rng=None, *, out=None):
        """CPU blocks: a single row or long rows one at a time through the numpy twin
        (:meth:`_encode_host`: numba's candidate pass), short rows by one top-(k + 1) per row
        from numba's ``topk_rows`` or numpy's introselect (:func:`_top_k_plus_one`), several
        times faster than ``torch.topk``; the largest key doubles as the NaN/Inf check, so the
        common case costs no extra pass. Other devices: the reference."""
        if not (_rows.is_block(X) and X.is_cpu):
            return self._encode_rows_ref(X, rng, out)
        if not dispatch.batch_encode(X):
            return Compressor.encode_rows(self, X, rng, out=out)
        plan, X, block = _rows.start_encode(self, X, out)
        m, d = X.shape
        views = {name: _rows.section(block, plan, name) for name in plan.sec.names}
        k = views["values"].shape[1]
        A = torch.abs(X, out=_rows.scratch(self, "abs", (m, d), X.dtype, X.device))
        tied = None
        if k == d:
            fin = torch.isfinite(A.amax(1))
            sel = torch.arange(d, device=X.device).expand(m, d)
            odd = not bool(fin.all())
        else:
            A = _order_key(A)  # magnitudes as integers: the same order, cheaper to compare
            sel, big, kth, nxt = _top_k_plus_one(A, k)
            fin = big < _inf_key(X.dtype)  # the row's largest |x_i| (NaN sorts first) is finite
            tie = kth == nxt
            odd = bool((fin <= tie).any())  # not finite, or a tie at t
            if odd:
                tied = torch.from_numpy(np.flatnonzero(tie))
                odd = not fin.all()
        if odd:
            if self.check_finite:
                bad = ~fin if isinstance(fin, torch.Tensor) else torch.from_numpy(~fin)
                _rows.encode_error(self, X, bad, "NaN/Inf")
            return self._encode_rows_ref(X, rng, out)  # garbage, but the reference's garbage
        if tied is not None:
            _resolve_row_ties(A, sel, tied, torch.from_numpy(kth), k)
        _write_rows(X, sel, views)
        return block

    @no_grad
    def _fast_decode_add_rows(self, out, block, weight=1.0, *, rows=None, check=True):
        """Vectorized: the checks of :meth:`from_bytes` on every row (index range and order,
        or the bitmap's count and tail), then one ``index_add_`` of ``w·v`` (rounded before
        the add, as both single-message paths do; a row's indices are distinct)."""
        st = self._start_rows_decode(out, block, weight, rows, check)
        if st is None:
            return self._decode_add_rows_ref(out, block, weight, rows, check)
        plan, block, tgt, w, bad, vals = st
        d = out.shape[1]
        m, k = vals.shape
        idx = _rows.section(block, plan, "index") if plan.param == 0 else None
        bm = _rows.section(block, plan, "bitmap") if plan.param != 0 else None
        if check:
            bad = self._bad_rows({"values": vals, ("index" if idx is not None else "bitmap"):
                                  idx if idx is not None else bm}, d, bad)
            bad = _rows.value_mask(self, {"values": vals}, bad)
            _rows.bad_row(self, out, block, tgt, bad, "bad row")
        sel = idx if idx is not None else _bitmap_indices(bm, d, k)
        return self._add_selected_rows(out, tgt, sel, vals, w)


_KEY_DTYPE = {torch.float64: torch.int64, torch.float32: torch.int32}


def _order_key(a: torch.Tensor) -> torch.Tensor:
    """Non-negative floats (``|x|``, NaN with its sign bit clear) viewed as signed integers of
    their width: bit patterns order exactly as the values (+inf above every finite value, NaN
    above +inf), and ``torch.topk`` compares integers faster than floats."""
    key = _KEY_DTYPE.get(a.dtype)
    return a if key is None else a.view(key)


@functools.cache
def _inf_key(dtype: torch.dtype) -> float | int:
    """``+inf`` as :func:`_order_key` sees it."""
    key = _KEY_DTYPE.get(dtype)
    return math.inf if key is None else int(torch.tensor(math.inf, dtype=dtype).view(key))


def _bitmap_indices(bm: torch.Tensor, d: int, k: int) -> torch.Tensor:
    """The [m, k] set positions of the [m, ⌈d/8⌉] bitmaps ``bm`` (exactly k bits in each row's
    first d), increasing in each row. On CPU numpy's nonzero on a bool view (cheaper than on
    uint8)."""
    m = bm.shape[0]
    if dispatch.numpy_path(bm.device):
        flags = np.unpackbits(bm.numpy(), axis=1, count=d, bitorder="little")
        pos = np.flatnonzero(flags.view(bool)).reshape(m, k)
        pos -= np.arange(0, m * d, d, dtype=pos.dtype)[:, None]
        return torch.from_numpy(pos)
    return _rows.unpack_rows(bm, d).nonzero()[:, 1].view(m, k)


def _top_k_plus_one(A: torch.Tensor, k: int) -> tuple[torch.Tensor, np.ndarray, np.ndarray,
                                                       np.ndarray]:
    """The positions of each row's k largest keys of the CPU ``A`` ([m, d], k < d) in
    increasing order (the set is unique where the k-th and (k+1)-th keys differ), and each
    row's largest, k-th and (k+1)-th largest key. The numba kernel ``topk_rows`` (a sampled
    threshold, then the few keys above it) where k is at most d/8, else numpy's introselect
    (``argpartition``): both several times faster than ``torch.topk`` at d = 2000."""
    m, d = A.shape
    a = A.numpy()
    kernel = dispatch.topk_rows_kernel(k, d)
    if kernel is not None:
        top, stats = np.empty((m, k), np.int64), np.empty((m, 3), a.dtype)
        kernel(a, k, top, stats)
        return torch.from_numpy(top), stats[:, 0], stats[:, 1], stats[:, 2]
    part = np.argpartition(a, d - k - 1, axis=1)[:, d - k - 1 :]  # (k+1)-th first, then top k
    keys = np.take_along_axis(a, part, 1)
    top = keys[:, 1:]
    return _sorted_rows(torch.from_numpy(part[:, 1:])), top.max(1), top.min(1), keys[:, 0]


def _resolve_row_ties(A: torch.Tensor, sel: torch.Tensor, tied: torch.Tensor, kth: torch.Tensor,
                      k: int) -> None:
    """Rows ``tied`` of ``sel`` ([m, k]), whose k-th and (k+1)-th largest keys of ``A`` tie at
    ``kth`` ([m]): every entry above it, then the lowest-index ones equal to it (a cumulative
    count), the set and order of :meth:`TopK.select`."""
    if not tied.numel():
        return
    tied = tied.to(A.device)
    At = A.index_select(0, tied)
    tt = kth.to(A.device).view(-1, 1).index_select(0, tied)
    gt = At > tt
    eq = At == tt
    keep = gt | (eq & (eq.cumsum(1) <= k - gt.sum(1, keepdim=True)))
    sel.index_copy_(0, tied, keep.nonzero()[:, 1].view(-1, k))


def _write_rows(X: torch.Tensor, sel: torch.Tensor, v: dict[str, torch.Tensor]) -> None:
    """The sections of top-k messages of the rows of ``X`` kept at ``sel`` ([m, k] increasing
    int64): the values, then the int32 indices or the bitmap."""
    vals = v["values"]
    torch.gather(X, 1, sel, out=vals) if vals.is_contiguous() else vals.copy_(X.gather(1, sel))
    if "index" in v:
        v["index"].copy_(sel)
    else:
        m, d = X.shape
        flags = torch.zeros((m, bits.padded(d)), dtype=torch.bool, device=X.device)
        flags.scatter_(1, sel, True)
        _rows.pack_rows(flags, d, v["bitmap"])


def _sorted_rows(idx: torch.Tensor) -> torch.Tensor:
    """Each row of the CPU ``idx`` (int64) in increasing order (numpy: a few µs less a call)."""
    return torch.from_numpy(np.sort(idx.numpy(), axis=1))


class RandK(_KSparse):
    """Keep k distinct coordinates drawn uniformly (a uniform k-subset), optionally ×d/k.

    Plain: biased, E C(x) = (k/d)·x, E‖C(x) − x‖² = (1 − k/d)‖x‖², δ = k/d.
    ``unbiased``: C(x) = (d/k)·x_S, E C(x) = x, ω = d/k − 1 (not contractive: divide by 1+ω
    before feeding CHOCO/BEER).
    Wire: a 63-bit seed drawn from the caller's stream (:meth:`gossip.rng.Stream.seeds`: one
    hashed word, the same on every device), then the k values in increasing
    index order: ``8 + 8 + k·itemsize`` bytes. The receiver regenerates the index set from
    the seed on the CPU (:func:`sample_distinct`, torch's CPU generator: both ends need the
    same torch version). On CUDA the seed is read on the host (one sync) and the indices are
    copied to the device. The NaN/Inf check sums x (one read pass).
    """

    kind: ClassVar[int] = 5
    randomized: ClassVar[bool] = True
    ordered_rows: ClassVar[bool] = True
    param_name: ClassVar[str] = "flags (1 = rescaled by d/k)"

    def __init__(
        self, spec: str, ratio: float | None = None, k: int | None = None, rescale: bool = False
    ) -> None:
        super().__init__(spec, ratio, k)
        self.rescale = rescale
        self.unbiased = rescale  # instance attribute: depends on the spec
        self.omega_exact = rescale  # E‖C(x)−x‖² = (d/k − 1)‖x‖² for every x
        if rescale:
            self.omega = None if ratio is None else 1.0 / ratio - 1.0
        else:
            self.delta = ratio

    @property
    def param(self) -> int:
        return int(self.rescale)

    def omega_for(self, numel: int) -> float | None:
        return numel / self.k_for(numel) - 1.0 if self.rescale else None

    def delta_for(self, numel: int) -> float | None:
        return None if self.rescale else self.k_for(numel) / numel

    def _sections(self, shape, dtype) -> Sections:
        d = numel_of(shape)
        return Sections.build(("seed", torch.int64, 1), ("values", dtype, self.k_for(d)))

    def _encode_batch(self, X: torch.Tensor, rng: Any, v: dict[str, torch.Tensor]) -> None:
        """One seed per row from its stream, each row's index set drawn from it on the host
        (memoized: the receivers in this process draw the same one), the kept values gathered
        for the block at once."""
        m, d = X.shape
        k = v["values"].shape[1]
        seeds = rng.seeds()
        v["seed"].copy_(seeds.view(m, 1))
        sel = _to_device(self._seed_indices(seeds, d, k), X.device)
        vals = v["values"]
        torch.gather(X, 1, sel, out=vals) if vals.is_contiguous() else vals.copy_(X.gather(1, sel))
        if self.rescale:
            vals.mul_(d / k)
            if self.check_finite and X.dtype == torch.float16:
                r = _rows.first(~torch.isfinite(vals).all(1))
                if r is not None:
                    exc = CompressionError(
                        f"{self.spec}: the kept entries times d/k = {d / k:.4g} overflow float16 "
                        "(largest value 65504); use bfloat16 models, or randk without :unbiased")
                    exc.row = r
                    raise exc

    @staticmethod
    def _seed_indices(seeds: torch.Tensor, d: int, k: int) -> torch.Tensor:
        """[m, k] int64 CPU: the index set of every seed of ``seeds`` ([m])."""
        return torch.from_numpy(np.stack([_distinct_cached(d, k, s) for s in seeds.tolist()]))

    def _rows_indices(self, v: dict[str, torch.Tensor], d: int) -> torch.Tensor:
        return self._seed_indices(v["seed"].view(-1), d, v["values"].shape[1])

    def _check_batch(self, v: dict[str, torch.Tensor], d: int) -> None:
        seeds = v["seed"].view(-1)
        r = _rows.first(seeds < 0)
        if r is not None:
            raise CompressionError(f"{self.spec}: bad seed {int(seeds[r])} (seeds are non-negative)")

    # ------------------------------------------------------- numpy fast path (CPU)
    def _encode_host(self, plan, x, xn, generator, v) -> dict[str, Any]:
        d, k = xn.size, v["values"].size
        if self.check_finite and not all_finite(xn, x):
            raise nonfinite(self.spec)
        seed = int(generator.seeds()[0])
        v["seed"][0] = seed
        idx = _distinct_cached(d, k, seed)
        vals = v["values"]
        np.take(xn, idx, out=vals)
        if self.rescale:
            vals *= d / k
        v["sel"] = idx
        return v

    def _parse_host(self, v, d: int) -> dict[str, Any]:
        seed = int(v["seed"][0])
        if seed < 0:
            raise CompressionError(f"{self.spec}: bad seed {seed} (seeds are non-negative)")
        return v

    def _sel_host(self, host: dict[str, Any], d: int) -> np.ndarray:
        sel = host.get("sel")
        if sel is None:
            sel = host["sel"] = _distinct_cached(d, host["values"].size, int(host["seed"][0]))
        return sel

    # ----------------------------------------------------- blocks of nodes (rows)
    def _fast_encode_rows(self, X, rng=None, *, out=None):
        """A CPU block of one row (a node per process) through the numpy twin, a few torch
        calls cheaper; other blocks, long rows too, by the reference (one gather: the numpy
        twin has no cache-sized chunks to gain there)."""
        if _rows.is_block(X) and X.is_cpu and X.shape[0] == 1:
            return Compressor.encode_rows(self, X, rng, out=out)
        return self._encode_rows_ref(X, rng, out)

    @no_grad
    def _fast_decode_add_rows(self, out, block, weight=1.0, *, rows=None, check=True):
        """Vectorized add: each row's index set comes from its seed (memoized, on the host),
        then one ``index_add_`` of ``w·v`` for the block, with a single message's rounding."""
        st = self._start_rows_decode(out, block, weight, rows, check)
        if st is None:
            return self._decode_add_rows_ref(out, block, weight, rows, check)
        plan, block, tgt, w, bad, vals = st
        d = out.shape[1]
        seeds = _rows.section(block, plan, "seed").view(-1)
        m, k = vals.shape
        if check:
            bad = _rows.value_mask(self, {"values": vals}, bad | (seeds < 0))
            _rows.bad_row(self, out, block, tgt, bad, "bad row")
        sel = _to_device(self._seed_indices(seeds, d, k), out.device)
        return self._add_selected_rows(out, tgt, sel, vals, w)


def _resolve_ties(cand: np.ndarray, ca: np.ndarray, t, k: int) -> np.ndarray:
    """From increasing candidates ``cand`` (values ``ca``, a superset of ``{a >= t}`` with at
    least k entries >= t), every entry > t, then the lowest-index entries equal to t: k in all."""
    ge = ca >= t
    if not ge.all():
        cand, ca = cand[ge], ca[ge]
    if cand.size == k:
        return cand
    keep = ca > t
    ties = np.nonzero(~keep)[0]
    keep[ties[: k - (cand.size - ties.size)]] = True
    return cand[keep]


_SEED_HIGH = (1 << 63) - 1
_SMALL = 2048  # below this many candidates, a permutation is the cheaper way


def sample_distinct(n: int, k: int, seed: int) -> torch.Tensor:
    """A uniform random k-subset of ``range(n)`` as sorted int64 CPU indices, from ``seed``.

    Deterministic given (n, k, seed) and the torch version (torch's CPU generator). Draws
    ``randint`` with a few extra draws beyond the expected need and deduplicates; the distinct
    values of i.i.d. uniform draws form a uniform subset given their number (the stopping
    rule only looks at that number), and surplus values are dropped by a recursive uniform
    choice, so the result is exactly uniform over k-subsets. For k > n/2 the complement is
    drawn instead.
    """
    gen = torch.Generator()
    gen.manual_seed(seed)
    return torch.from_numpy(_distinct(n, k, gen))


_CACHE: OrderedDict[tuple[int, int, int], np.ndarray] = OrderedDict()
_CACHE_LOCK = threading.Lock()
_CACHE_KEYS = 256  # index sets kept (a sender's and its receivers' in one process share one)
_CACHE_ENTRIES = 1 << 21  # ... holding at most this many indices (16 MiB)
_cache_entries = 0


def _distinct_cached(n: int, k: int, seed: int) -> np.ndarray:
    """:func:`sample_distinct` as a numpy array, memoized by (n, k, seed).

    In-process runs decode each message at the sender and at every neighbor; the index set
    is drawn once. The array is shared: callers must not write to it.
    """
    global _cache_entries
    key = (n, k, seed)
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
            return hit
    gen = torch.Generator()
    gen.manual_seed(seed)
    idx = _distinct(n, k, gen)
    if idx.size <= _CACHE_ENTRIES // 4:
        with _CACHE_LOCK:
            if key not in _CACHE:
                _CACHE[key] = idx
                _cache_entries += idx.size
                while len(_CACHE) > _CACHE_KEYS or _cache_entries > _CACHE_ENTRIES:
                    _cache_entries -= _CACHE.popitem(last=False)[1].size
    return idx


def _distinct(n: int, k: int, gen: torch.Generator) -> np.ndarray:
    if k <= 0:
        return np.empty(0, dtype=np.int64)
    if k >= n:
        return np.arange(n, dtype=np.int64)
    if 2 * k > n:
        keep = np.ones(n, dtype=bool)
        keep[_distinct(n, n - k, gen)] = False
        return np.flatnonzero(keep)
    if n <= _SMALL:
        return np.sort(torch.randperm(n, generator=gen)[:k].numpy())
    # expected distinct values of m draws: n(1 - (1 - 1/n)^m) ≈ k for m = -n·log1p(-k/n)
    m = math.ceil(-n * math.log1p(-k / n) + 4.0 * math.sqrt(k) + 16)
    vals = _unique_sorted(torch.randint(0, n, (m,), generator=gen).numpy())
    while vals.size < k:
        more = torch.randint(0, n, (2 * (k - vals.size) + 16,), generator=gen).numpy()
        vals = _unique_sorted(np.concatenate([vals, more]))
    if vals.size > k:
        keep = np.ones(vals.size, dtype=bool)
        keep[_distinct(vals.size, vals.size - k, gen)] = False
        vals = vals[keep]
    return vals


def _unique_sorted(a: np.ndarray) -> np.ndarray:
    a = np.sort(a)
    if a.size < 2:
        return a
    keep = np.empty(a.size, dtype=bool)
    keep[0] = True
    np.not_equal(a[1:], a[:-1], out=keep[1:])
    return a[keep]


def _to_device(idx: torch.Tensor, device: torch.device) -> torch.Tensor:
    return idx if idx.device == device else idx.to(device)


__all__ = ["TopK", "RandK", "sample_distinct"]


class StackedTopK(Codec):
    """Top-k of a row that stacks P vectors of n entries each (``[u¹, …, uᴾ]``, d = P·n): per
    part the k = ``max(1, ⌊ratio·n⌋)`` entries of largest magnitude, with one **shared** index
    set (chosen by ``|u¹|``, the first part, and applied to every part) or a **separate** one
    per part (each by its own magnitudes). Ties go to the lowest index.

    Built by a method that sends several vectors of the model's size in one message (federated
    Adam's updates of x, m and v: :class:`gossip.algorithms.federated_adam.FedAdamSSM`); it is
    not a ``--compressor`` of its own (its row must be P stacked vectors). Biased, contractive
    on the first part (δ = k/n there). Wire (int32 indices, in increasing order per part):
    shared ``8 + P·k·itemsize + 4k`` bytes, separate ``8 + P·k·(itemsize + 4)``.

    Args:
        spec: a name for messages and errors (e.g. ``"stacked-topk:0.1:3:shared"``).
        ratio: the kept fraction of each part, in (0, 1].
        parts: P >= 1.
        shared: one index set for all parts (True) or one per part.
    """

    ordered_rows: ClassVar[bool] = True

    def __init__(self, spec: str, ratio: float, parts: int, shared: bool = True) -> None:
        super().__init__(spec)
        if not 0.0 < ratio <= 1.0:
            raise CompressionError(f"{spec}: ratio {ratio} must be in (0, 1]")
        if int(parts) != parts or parts < 1:
            raise CompressionError(f"{spec}: parts = {parts} must be a whole number >= 1")
        self.ratio, self.parts, self.shared = float(ratio), int(parts), bool(shared)

    def split(self, d: int) -> tuple[int, int]:
        """(n, k): entries per part and kept per part of a row of ``d`` entries."""
        if d % self.parts:
            raise CompressionError(f"{self.spec}: a row of {d} entries is not {self.parts} "
                                   "parts of equal length")
        n = d // self.parts
        if n > _INT32_MAX:
            raise CompressionError(f"{self.spec}: n = {n} does not fit int32 indices")
        return n, max(1, int(self.ratio * n))

    def delta_for(self, numel: int) -> float | None:
        n, k = self.split(numel)
        return k / n

    def _sections(self, shape, dtype) -> Sections:
        n, k = self.split(numel_of(shape))
        sets = 1 if self.shared else self.parts
        return Sections.build(("values", dtype, self.parts * k), ("index", torch.int32, sets * k))

    @staticmethod
    def _top(score: torch.Tensor, k: int) -> torch.Tensor:
        """Increasing int64 indices of the k largest entries of each row of ``score``
        (≥ 0), the lowest index first among ties (a stable descending sort)."""
        order = torch.sort(score, dim=-1, descending=True, stable=True).indices
        return order[..., :k].sort(-1).values

    def _encode_batch(self, X: torch.Tensor, rng: Any, v: dict[str, torch.Tensor]) -> None:
        m, d = X.shape
        n, k = self.split(d)
        parts = X.view(m, self.parts, n)
        if self.shared:
            sel = self._top(parts[:, 0].abs(), k)  # [m, k]
            full = sel.unsqueeze(1).expand(m, self.parts, k)
        else:
            full = sel = self._top(parts.abs(), k)  # [m, P, k]
        v["values"].copy_(parts.gather(2, full).reshape(m, -1))
        v["index"].copy_(sel.reshape(m, -1))

    def _indices(self, v: dict[str, torch.Tensor]) -> torch.Tensor:
        """[m, P, k] int64 indices within a part."""
        m = v["values"].shape[0]
        k = v["values"].shape[1] // self.parts
        idx = v["index"].long().view(m, -1, k)
        return idx.expand(m, self.parts, k) if self.shared else idx

    def _decode_batch(self, v: dict[str, torch.Tensor], out: torch.Tensor) -> None:
        m, d = out.shape
        out.zero_()
        idx = self._indices(v).to(out.device)
        out.view(m, self.parts, d // self.parts).scatter_(
            2, idx, v["values"].view(m, self.parts, -1))

    def _check_batch(self, v: dict[str, torch.Tensor], d: int) -> None:
        n, k = self.split(d)
        idx = v["index"].view(v["index"].shape[0], -1, k)
        bad = (idx.amin(2) < 0) | (idx.amax(2) >= n)
        if k > 1:
            bad |= (idx[..., 1:] <= idx[..., :-1]).any(2)
        r = _rows.first(bad.any(1))
        if r is not None:
            raise CompressionError(f"{self.spec}: indices of row {r} leave [0, {n}) or do not "
                                   "increase")
