"""One batch of reports/analyze_run.py's token pass: classify candidate rows against their references'
rows, attribute them (crossings), digest the prefixes the restore links compare, append the frame rows."""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import pyarrow as pa

from records.columns import null_columns, overrides, row_as_record, stored_columns, top_k_columns
from reports.analyze import (
    REQUEST_COLUMNS,
    crossing_dict,
    inferred_crossings,
    pool_limits,
    record_interval,
    row_of,
    verify_crossings,
)
from reports.analyze_trace import accepted_of, crossings_of
from reports.facts import TokenFacts, accepted_tokens, first_token_drift
from reports.oracle_vec import Side, _list, classify_batch
from reports.window import window_fact

TOKENS = stored_columns(["role", "input_hash", "input_ids", "output_ids", "output_logprobs", "output_top_logprobs",
                         "spec_trace"])
REF_TOKENS = stored_columns(["error", "output_ids", "output_logprobs", "output_top_logprobs"])
ORACLE_FIELDS = {"output_ids", "output_logprobs", "output_top_logprobs", "error"}
_TOKEN_FIELDS = ("output_ids", "output_logprobs", "output_top_logprobs")
PAD_CAND, PAD_REF = -(1 << 40), -(1 << 41)


def digest(ids) -> bytes:
    """A 16-byte digest of a list of token ids (equal lists, equal digests)."""
    arr = ids.astype(np.int64) if isinstance(ids, np.ndarray) else np.asarray(list(ids), dtype=np.int64)
    return hashlib.blake2b(arr.tobytes(), digest_size=16).digest()


def _side(table, pad: int) -> Side:
    return Side.of(table.column("output_ids"), table.column("output_logprobs"), *top_k_columns(table), pad)


def _references(tb, recs, index, store):
    """The references' token rows aligned with the batch (null rows where there is none), and which exist."""
    wheres = [index.refs.get(str(r.get("input_hash"))) for r in recs]
    has_ref = np.array([w is not None for w in wheres], dtype=bool)
    found = store.take([w for w in wheres if w is not None], REF_TOKENS)
    at, pos = 0, []
    for w in wheres:
        pos.append(at if w is not None else None)
        at += w is not None
    if found.num_rows == 0:
        return null_columns(REF_TOKENS, len(recs)), has_ref
    if has_ref.all():
        return found, has_ref
    return found.take(pa.array(pos, pa.int64())).combine_chunks(), has_ref


def batch_rows(tb, ks, recs, index, store, prompts, per_pool, default, cols, digests, facts, spill,
               ladder_pools=None) -> None:
    """Append the frame rows of candidate rows `tb` (global rows `ks`, their scalar fields `recs`) to `cols`,
    their TokenFacts to `facts` (reports/facts.py; ladder sums for the pools `ladder_pools(pool)` names) and their
    input and output ids with what the tree shapes read of them to `spill`."""
    n = len(recs)
    over = overrides(tb)  # where a row departs from its typed columns (records/columns.py)
    extras = [ov.values for ov in over]
    ref, has_ref = _references(tb, recs, index, store)
    r_over = overrides(ref)
    r_extras = [ov.values for ov in r_over]
    r_err = ref.column("error").to_pylist()
    ref_error = [r_extras[i].get("error", r_err[i]) if has_ref[i] else None for i in range(n)]
    cand, rside = _side(tb, PAD_CAND), _side(ref, PAD_REF)
    odd = np.array([bool(set(extras[i]) & set(_TOKEN_FIELDS)) or bool(set(r_extras[i]) & set(_TOKEN_FIELDS))
                    for i in range(n)], dtype=bool)
    cand = dataclasses.replace(cand, irregular=cand.irregular | odd)
    limits = [pool_limits(per_pool, r.get("pool"), default) for r in recs]

    def fallback(i: int) -> tuple[dict, dict | None]:
        c = {**row_as_record(tb, i, _TOKEN_FIELDS, over[i]), "error": recs[i].get("error")}
        r = {**row_as_record(ref, i, _TOKEN_FIELDS, r_over[i]), "error": ref_error[i]} if has_ref[i] else None
        return c, r

    classes = classify_batch(cand, rside, [r.get("error") for r in recs], ref_error, has_ref,
                             np.array([t for t, _, _ in limits]), np.array([t for _, t, _ in limits]), fallback,
                             [e for _, _, e in limits])
    intervals = [record_interval(r) for r in recs]
    reported = crossings_of(tb.column("spec_trace"), intervals)
    _facts(tb, recs, cand, rside, has_ref, cand.irregular | rside.irregular, extras, fallback, facts)
    if ladder_pools is not None:  # from record dicts of the row: each token list read once more, only for these
        first = len(facts) - n  # the batch's first row in `facts`
        for i, rec in enumerate(recs):
            if ladder_pools(str(rec.get("pool"))):
                facts.add_ladder(first + i, *fallback(i))
    inputs = _inputs(tb, ks, recs, over, index, store, prompts)
    for i, k in enumerate(ks):
        rec, ids = recs[i], inputs.get(i)
        out_ids = extras[i]["output_ids"] if "output_ids" in extras[i] else \
            cand.ids[cand.ids_start[i]:cand.ids_start[i] + cand.ids_len[i]]
        spill.add(k, ids, out_ids, rec)
        output_len = len(out_ids or []) if not isinstance(out_ids, np.ndarray) else len(out_ids)
        input_len = int(rec.get("input_len") or (len(ids) if ids is not None else 0))
        in_len, seq_lens = index.in_len.get(k), index.seq_lens.get(k)
        if in_len or seq_lens:
            if ids is None or not len(ids):
                digests.no_input.add(k)
            for length in in_len:
                digests.add(k, -length, digest(ids[:length] if ids is not None else []))
            seq = np.concatenate([np.asarray(ids if ids is not None else [], np.int64),
                                  np.asarray(out_ids if out_ids is not None else [], np.int64)])
            for length in seq_lens:
                digests.add(k, length, digest(seq[:length]))
        interval = intervals[i]
        if interval is None:
            xs, source = [], "none"
        elif "spec_trace" in extras[i]:
            trace = extras[i]["spec_trace"]
            xs, source = (verify_crossings(trace, interval), "reported") if trace is not None else \
                (inferred_crossings(input_len, output_len, interval), "inferred")
            xs = [crossing_dict(x) for x in xs]
        elif reported[i] is not None:
            xs, source = reported[i], "reported"
        else:
            xs, source = [crossing_dict(x) for x in inferred_crossings(input_len, output_len, interval)], "inferred"
        ref_len = None
        if has_ref[i]:
            r_out = r_extras[i]["output_ids"] if "output_ids" in r_extras[i] else None
            ref_len = len(r_out or []) if "output_ids" in r_extras[i] else int(rside.ids_len[i])
        row = row_of(rec, classes[i], interval, input_len, output_len, ref_len, xs, source)
        for c in REQUEST_COLUMNS:
            cols[c].append(row[c])


def _facts(tb, recs, cand, rside, has_ref, irregular, extras, fallback, facts: TokenFacts) -> None:
    """The batch's TokenFacts: first-token drift from the flat arrays (rows the array path cannot read exactly,
    from their record dicts), accepted draft tokens from spec_trace (reports/analyze_trace.py), the restore
    window from the probe's fields (they have no columns of their own)."""
    n = len(recs)
    odd = irregular | np.array([bool(set(e) & {*_TOKEN_FIELDS, "spec_trace"}) for e in extras], dtype=bool)
    ok = ~odd & has_ref & (cand.ids_len > 0) & (cand.lp_len > 0) & (rside.ids_len > 0) & (rside.lp_len > 0)
    drift: list[float | None] = [None] * n
    if ok.any():
        c_id, r_id = cand.ids[np.where(ok, cand.ids_start, 0)], rside.ids[np.where(ok, rside.ids_start, 0)]
        c_lp, r_lp = cand.lp[np.where(ok, cand.lp_start, 0)], rside.lp[np.where(ok, rside.lp_start, 0)]
        ok &= (c_id == r_id) & ~np.isnan(c_lp) & ~np.isnan(r_lp)
        values = np.abs(c_lp - r_lp)
        for i in np.flatnonzero(ok).tolist():
            drift[i] = float(values[i])
    accepted = accepted_of(tb.column("spec_trace"))
    for i in range(n):
        if odd[i]:
            drift[i] = first_token_drift(*fallback(i))
            if "spec_trace" in extras[i]:
                accepted[i] = accepted_tokens(extras[i]["spec_trace"])
        facts.add(recs[i]["key"], drift[i], accepted[i], window_fact(extras[i]))


def _inputs(tb, ks, recs, over, index, store, prompts) -> dict[int, object]:
    """Input ids (numpy, or the record's own value) of every batch row: the restore links compare prefixes of
    them, tree shapes walk them."""
    if not ks:
        return {}
    start, length, values = _list(tb.column("input_ids"))
    flat = values.to_numpy(zero_copy_only=False)
    valid = tb.column("input_ids").is_valid().to_numpy(zero_copy_only=False)
    out: dict[int, object] = {}
    stored = []
    for i in range(len(ks)):
        if "input_ids" in over[i].values:
            out[i] = over[i].values["input_ids"]
        elif valid[i]:
            out[i] = flat[start[i]:start[i] + length[i]]
        elif "input_ids" in over[i].absent:
            out[i] = None
        else:
            stored.append(i)
    if stored:
        hashes = [tb.column("input_hash")[i].as_py() for i in stored]
        missing = [h for h in hashes if h not in prompts]
        if missing:
            raise ValueError(f"{store.reader.run_dir / 'records'}: a record's input ids are stored under input_hash "
                             f"{missing[0]}, but no prompts.parquet holds it (the run directory is damaged)")
        ids = store.prompt_ids([prompts[h] for h in hashes])
        p_start, p_len, p_vals = _list(ids)
        p_flat = p_vals.to_numpy(zero_copy_only=False)
        for n, i in enumerate(stored):
            out[i] = p_flat[p_start[n]:p_start[n] + p_len[n]]
    return out
