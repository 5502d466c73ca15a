//! Constrained rows inside a decode step: their next-token masks are computed on a worker
//! thread while the step's forward runs, then joined and applied to each constrained row's
//! logits alone before sampling. Unconstrained rows never see a mask.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use mlx_rs::Array;

use super::row::Row;
use crate::constrain::RowConstraint;
use crate::{Error, Result};

type Work = Arc<Mutex<(Vec<(usize, RowConstraint, Result<()>)>, Duration)>>;

/// Masks being computed off the critical path: the constraints taken out of their rows.
pub(super) struct PendingMasks {
    work: Work,
    job: Option<JoinHandle<()>>,
}

impl PendingMasks {
    /// Starts computing the next-token masks of `rows`' constraints (no thread when no row
    /// needs one).
    pub(super) fn start(rows: &mut [Row]) -> PendingMasks {
        let taken: Vec<(usize, RowConstraint, Result<()>)> = rows
            .iter_mut()
            .enumerate()
            .filter(|(_, r)| r.finish.is_none() && r.constraint_active() && r.constraint.as_ref().is_some_and(RowConstraint::needs_mask))
            .filter_map(|(b, r)| r.constraint.take().map(|c| (b, c, Ok(()))))
            .collect();
        let work: Work = Arc::new(Mutex::new((taken, Duration::ZERO)));
        if work.lock().0.is_empty() {
            return PendingMasks { work, job: None };
        }
        let shared = Arc::clone(&work);
        // Should the thread not start, `join` computes the masks on the caller's thread.
        let job = std::thread::Builder::new().name("weft-masks".into()).spawn(move || compute(&shared)).ok();
        PendingMasks { work, job }
    }

    /// Waits for the masks and gives the constraints back to their rows; a row whose mask
    /// failed is failed alone. Returns the time the masks took to compute.
    pub(super) fn join(self, rows: &mut [Row]) -> Result<Duration> {
        if let Some(job) = self.job {
            job.join().map_err(|_| Error::Mlx("computing constrained-decoding masks panicked".into()))?;
        } else {
            compute(&self.work);
        }
        let (done, took) = std::mem::take(&mut *self.work.lock());
        for (b, c, result) in done {
            let row = &mut rows[b];
            row.constraint = Some(c);
            if let Err(e) = result {
                row.fail_later(&e);
            }
        }
        Ok(took)
    }
}

fn compute(work: &Work) {
    let started = Instant::now();
    let mut work = work.lock();
    for (_, c, result) in work.0.iter_mut() {
        *result = c.prepare_mask();
    }
    work.1 = started.elapsed();
}

/// The `[rows, width]` additive bias of a whole batch: each constrained row's mask (a row
/// whose reasoning budget is closing its block: that one token), zeros for the others (adding
/// 0 leaves their logits bit-identical; so does a constraint waiting out the reasoning).
pub(super) fn batch_bias(rows: &mut [Row], width: usize, dtype: mlx_rs::Dtype) -> Result<Array> {
    let mut all = vec![0.0f32; rows.len() * width];
    for (b, row) in rows.iter_mut().enumerate() {
        // Failed or finished rows (their token is thrown away) keep a zero bias.
        if row.error.is_some() || row.finish.is_some() {
            continue;
        }
        if let Some(token) = row.reasoning.as_ref().and_then(|r| r.forced()) {
            let slice = &mut all[b * width..(b + 1) * width];
            slice.fill(f32::NEG_INFINITY);
            if let Some(t) = slice.get_mut(token as usize) {
                *t = 0.0;
            }
            continue;
        }
        if !row.constraint_active() {
            continue;
        }
        let Some(c) = row.constraint.as_mut() else { continue };
        match c.bias(width, &row.stop_token_ids) {
            Ok(Some(bias)) => all[b * width..(b + 1) * width].copy_from_slice(&bias),
            Ok(None) => {} // a triggered grammar before its trigger: free text
            Err(e) => row.fail_later(&e),
        }
    }
    Ok(Array::from_slice(&all, &[rows.len() as i32, width as i32]).as_dtype(dtype)?)
}
