//! The running batch: its rows, their per-layer batched caches, and the tokens of a decode step
//! still being computed. The invariant the executor relies on: row `b` of `rows`, row `b` of
//! every cache, and (for `b < in_flight.rows`) element `b` of the in-flight token array are the
//! same request; every operation here keeps the three aligned.

use mlx_rs::ops::concatenate;
use mlx_rs::Array;

use super::row::Row;
use crate::cache::{self, KvCache};
use crate::{Error, Result};

/// Tokens of a decode step still being computed, for the first `rows` rows of the batch, and
/// (row by row, `None` for rows that did not ask) the float32 log-probabilities `[1, V]` they
/// were chosen from, read together with the tokens.
pub(super) struct InFlight {
    pub(super) tokens: Array,
    pub(super) rows: usize,
    pub(super) logprobs: Vec<Option<Array>>,
}

/// A row taken out of the batch, with its KV as single-sequence caches when they were asked
/// for (for the prompt cache, or to park the row).
pub(super) struct Removed {
    pub(super) row: Row,
    pub(super) caches: Option<Vec<Box<dyn KvCache>>>,
}

#[derive(Default)]
pub(super) struct RunningBatch {
    pub(super) rows: Vec<Row>,
    /// Per-layer batched caches of `rows` (`None` exactly when there are no rows).
    caches: Option<Vec<Box<dyn KvCache>>>,
    pub(super) in_flight: Option<InFlight>,
    /// A draft model's batched caches for the first `draft_rows` rows (later rows joined since
    /// the last draft; [`super::speculative::Drafter::draft`] extends them).
    pub(super) draft_caches: Vec<Box<dyn KvCache>>,
    pub(super) draft_rows: usize,
}

impl RunningBatch {
    /// A batch of rows whose batched caches are ready (e.g. rows that just prefilled).
    pub(super) fn new(rows: Vec<Row>, caches: Vec<Box<dyn KvCache>>) -> RunningBatch {
        let caches = (!rows.is_empty()).then_some(caches);
        RunningBatch { rows, caches, in_flight: None, draft_caches: Vec::new(), draft_rows: 0 }
    }

    pub(super) fn len(&self) -> usize {
        self.rows.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub(super) fn caches_mut(&mut self) -> Result<&mut Vec<Box<dyn KvCache>>> {
        self.caches.as_mut().ok_or_else(|| Error::Mlx("decoding rows without a batch cache".into()))
    }

    pub(super) fn nbytes(&self) -> usize {
        self.caches.iter().flatten().map(|c| c.nbytes()).sum()
    }

    /// Appends `other`'s rows after this batch's own (a step in flight keeps covering the rows
    /// it covered; the new rows' inputs are on the host). `other` must have no step in flight.
    /// On failure this batch's caches may be half-extended (the caller fails it) and `other`'s
    /// rows come back with the error.
    pub(super) fn append(&mut self, other: RunningBatch) -> std::result::Result<(), (Error, Vec<Row>)> {
        debug_assert!(other.in_flight.is_none());
        let RunningBatch { rows, caches, .. } = other;
        let Some(caches) = caches else { return Ok(()) };
        match self.caches.as_mut() {
            None => self.caches = Some(caches),
            Some(batch) => {
                if let Err(e) = batch.iter_mut().zip(caches).try_for_each(|(b, c)| cache::extend_rows(b.as_mut(), c)) {
                    return Err((e, rows));
                }
            }
        }
        self.rows.extend(rows);
        Ok(())
    }

    /// `[B, 1]` inputs: the in-flight tokens (on device) for the rows they cover, then the
    /// host-known last tokens of rows that joined after.
    pub(super) fn step_inputs(&self) -> Result<Array> {
        let covered = self.in_flight.as_ref().map_or(0, |f| f.rows);
        let host: Vec<u32> = self.rows[covered..]
            .iter()
            .map(|r| r.next_input.ok_or_else(|| Error::Mlx("a decoding row has no input token".into())))
            .collect::<Result<_>>()?;
        let host = Array::from_slice(&host, &[host.len() as i32]);
        let tokens = match &self.in_flight {
            Some(f) if host.size() == 0 => f.tokens.clone(),
            Some(f) => concatenate(&[f.tokens.clone(), host], 0)?,
            None => host,
        };
        Ok(tokens.reshape(&[-1, 1])?)
    }

    /// Takes the rows `remove` says out of the batch (caches and in-flight tokens alike), in
    /// batch order, extracting their KV where `extract` says so. Each predicate is asked once per
    /// row: a consumer may pause or resume its row from another thread meanwhile. An extraction
    /// failure leaves that row's caches `None`; a failure to filter the batch is an error for the
    /// whole batch.
    pub(super) fn remove(&mut self, remove: impl Fn(&Row) -> bool, extract: impl Fn(&Row) -> bool) -> Result<Vec<Removed>> {
        let removing: Vec<bool> = self.rows.iter().map(remove).collect();
        if !removing.contains(&true) {
            return Ok(Vec::new());
        }
        let keep: Vec<usize> = (0..self.rows.len()).filter(|&i| !removing[i]).collect();
        let extracting: Vec<bool> = self.rows.iter().enumerate().map(|(i, r)| removing[i] && extract(r)).collect();
        let extracted: Vec<Option<Vec<Box<dyn KvCache>>>> = match self.caches.as_mut() {
            // A lone row leaving takes the batch's storage whole: the batch is dropped below.
            Some(caches) if extracting == [true] => vec![cache::take_only_row(caches).ok()],
            _ => extracting
                .iter()
                .enumerate()
                .map(|(i, &x)| match (&self.caches, x) {
                    (Some(caches), true) => cache::extract_row(caches, i).ok(),
                    _ => None,
                })
                .collect(),
        };
        if let Some(f) = self.in_flight.as_mut() {
            let kept: Vec<u32> = keep.iter().filter(|&&i| i < f.rows).map(|&i| i as u32).collect();
            if kept.is_empty() {
                self.in_flight = None;
            } else if kept.len() < f.rows {
                let idx = Array::from_slice(&kept, &[kept.len() as i32]);
                f.tokens = f.tokens.take_axis(&idx, 0)?;
                f.rows = kept.len();
                f.logprobs = kept.iter().map(|&i| f.logprobs[i as usize].take()).collect();
            }
        }
        let mut removed = Vec::new();
        for ((i, row), caches) in std::mem::take(&mut self.rows).into_iter().enumerate().zip(extracted) {
            if !removing[i] {
                self.rows.push(row);
            } else {
                removed.push(Removed { row, caches });
            }
        }
        if self.rows.is_empty() {
            self.caches = None;
            self.in_flight = None;
        } else if let Some(caches) = self.caches.as_mut() {
            cache::filter_rows(caches, &keep)?;
        }
        // The draft rows stay a prefix: kept rows keep their order.
        let draft_keep: Vec<usize> = keep.iter().copied().filter(|&i| i < self.draft_rows).collect();
        if draft_keep.is_empty() {
            self.draft_caches.clear();
        } else if draft_keep.len() < self.draft_rows {
            cache::filter_rows(&mut self.draft_caches, &draft_keep)?;
        }
        self.draft_rows = draft_keep.len();
        Ok(removed)
    }

    /// Empties the batch (after a failed step), returning its rows.
    pub(super) fn clear(&mut self) -> Vec<Row> {
        self.caches = None;
        self.in_flight = None;
        self.draft_caches.clear();
        self.draft_rows = 0;
        std::mem::take(&mut self.rows)
    }
}
