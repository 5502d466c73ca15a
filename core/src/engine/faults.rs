//! Deliberate failures for testing the final-event guarantee in every face (Rust, C, Node,
//! Swift, the server). Only builds with the `faults` cargo feature can inject them (release
//! builds do not enable it): set `EngineConfig::faults`, or, through a face that fills its
//! options from the environment (`crate::env`), `WEFT_FAULTS`, e.g.
//! `WEFT_FAULTS=forward-error@3,step-panic@5,driver-panic@8`. Each fault fires once.

use crate::{Error, Result};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    /// Decode step N (1-based) fails as a forward pass that MLX rejected: the rows in the
    /// batch get an `Error`, the engine goes on.
    pub forward_error_at_step: Option<u64>,
    /// Decode step N panics inside the step: its rows get an `Error`, the engine goes on.
    pub step_panic_at_step: Option<u64>,
    /// After decode step N the driver thread panics outside any step: the engine dies, every
    /// outstanding request gets an `Error`, and later submits fail.
    pub driver_panic_after_step: Option<u64>,
}

impl Faults {
    /// Parses `name@step[,name@step...]` (names: forward-error, step-panic, driver-panic).
    #[cfg_attr(not(feature = "faults"), allow(dead_code))]
    pub fn parse(spec: &str) -> Result<Faults> {
        let mut f = Faults::default();
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let bad = || Error::InvalidRequest(format!("faults: `{item}` is not name@step (forward-error, step-panic, driver-panic)"));
            let (name, step) = item.split_once('@').ok_or_else(bad)?;
            let step: u64 = step.parse().map_err(|_| bad())?;
            let slot = match name {
                "forward-error" => &mut f.forward_error_at_step,
                "step-panic" => &mut f.step_panic_at_step,
                "driver-panic" => &mut f.driver_panic_after_step,
                _ => return Err(bad()),
            };
            *slot = Some(step);
        }
        Ok(f)
    }

    /// Takes (fires) `slot` if it is due at decode step `step`.
    pub(crate) fn fire(slot: &mut Option<u64>, step: u64) -> bool {
        if *slot == Some(step) {
            *slot = None;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::Faults;

    #[test]
    fn parses_every_fault_and_rejects_junk() {
        let f = Faults::parse("forward-error@3, step-panic@5,driver-panic@8").unwrap();
        assert_eq!((f.forward_error_at_step, f.step_panic_at_step, f.driver_panic_after_step), (Some(3), Some(5), Some(8)));
        assert_eq!(Faults::parse("").unwrap(), Faults::default());
        for bad in ["oops@1", "step-panic", "step-panic@x"] {
            assert!(Faults::parse(bad).is_err(), "{bad}");
        }
    }
}
