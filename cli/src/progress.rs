//! Drawing the model store's progress reports (`weft::model_store::Progress`) on stderr: a
//! `\r`-redrawn bar with percent, MB and MB/s on a terminal; otherwise a plain line when a phase
//! starts, every ~5 s, and when it ends (logs and CI output stay readable).

use std::fmt::Write as _;
use std::io::{self, IsTerminal, Write};
use std::time::{Duration, Instant};

use weft::model_store::{Phase, Progress};

/// Interval between two plain (non-terminal) lines within a phase.
const LINE_INTERVAL: Duration = Duration::from_secs(5);
const BAR_WIDTH: usize = 30;

/// A progress callback that draws on stderr (a bar if stderr is a terminal, else lines).
pub fn stderr_progress() -> impl FnMut(Progress) {
    let mut view = ProgressView::new(io::stderr(), io::stderr().is_terminal());
    move |p| view.update(p)
}

/// Renders a sequence of progress reports to `out`. Write errors are ignored: progress is
/// decoration and must never fail an install.
pub struct ProgressView<W: Write> {
    out: W,
    /// Redraw one line with `\r` (a terminal) instead of printing lines.
    tty: bool,
    phase: Option<Phase>,
    /// The current phase's total: a report with another one starts a new bar (a Hugging Face
    /// download reports its files in batches, each with its own total).
    total: Option<u64>,
    started: Instant,
    last_line: Instant,
    /// A bar is drawn without its newline yet.
    line_open: bool,
    /// The current phase already reported completion; later reports of it are ignored.
    finished: bool,
}

impl<W: Write> ProgressView<W> {
    pub fn new(out: W, tty: bool) -> Self {
        let now = Instant::now();
        ProgressView { out, tty, phase: None, total: None, started: now, last_line: now, line_open: false, finished: false }
    }

    pub fn update(&mut self, p: Progress) {
        let now = Instant::now();
        if self.phase != Some(p.phase) || (p.phase == Phase::Downloading && self.total != p.total) {
            if self.line_open {
                let _ = writeln!(self.out);
                self.line_open = false;
            }
            self.phase = Some(p.phase);
            self.total = p.total;
            self.started = now;
            self.finished = false;
            match p.phase {
                Phase::Waiting => {
                    let _ = writeln!(self.out, "weft: another process is installing the model; waiting for it");
                    return;
                }
                Phase::Done => return,
                _ if !self.tty => {
                    let size = p.total.map(|t| format!(" ({:.1} MB)", t as f64 / 1e6)).unwrap_or_default();
                    let _ = writeln!(self.out, "weft: {}{size}...", phase_label(p.phase));
                    self.last_line = now;
                }
                _ => {}
            }
        }
        if matches!(p.phase, Phase::Waiting | Phase::Done) || self.finished {
            return;
        }
        let secs = now.duration_since(self.started).as_secs_f64();
        let rate = if secs > 0.05 { p.downloaded as f64 / 1e6 / secs } else { 0.0 };
        let complete = p.total.is_some_and(|t| p.downloaded >= t);
        let mb = p.downloaded as f64 / 1e6;
        if self.tty {
            let mut line = format!("\r  {:<11}", phase_label(p.phase));
            match p.total {
                Some(t) if t > 0 => {
                    let frac = (p.downloaded as f64 / t as f64).min(1.0);
                    let filled = (frac * BAR_WIDTH as f64) as usize;
                    let _ = write!(
                        line,
                        " [{}{}] {:>3.0}% {:>6.1}/{:.1} MB",
                        "#".repeat(filled),
                        "-".repeat(BAR_WIDTH - filled),
                        frac * 100.0,
                        mb,
                        t as f64 / 1e6
                    );
                }
                _ => {
                    let _ = write!(line, " {mb:>6.1} MB");
                }
            }
            let _ = write!(line, " {rate:>6.1} MB/s  ");
            let _ = write!(self.out, "{line}");
            let _ = self.out.flush();
            self.line_open = true;
            if complete {
                let _ = writeln!(self.out);
                self.line_open = false;
            }
        } else if complete {
            let _ = writeln!(
                self.out,
                "weft: {} done: {mb:.1} MB in {secs:.1} s ({rate:.1} MB/s)",
                phase_label(p.phase)
            );
        } else if now.duration_since(self.last_line) >= LINE_INTERVAL {
            let pct = p.total.filter(|&t| t > 0).map(|t| format!("{:.0}% ", 100.0 * p.downloaded as f64 / t as f64));
            let _ = writeln!(
                self.out,
                "weft: {} {}{mb:.1} MB ({rate:.1} MB/s)",
                phase_label(p.phase),
                pct.unwrap_or_default()
            );
            self.last_line = now;
        }
        self.finished = complete;
    }
}

fn phase_label(p: Phase) -> &'static str {
    match p {
        Phase::Waiting => "waiting",
        Phase::Downloading => "downloading",
        Phase::Verifying => "verifying",
        Phase::Extracting => "extracting",
        Phase::Done => "done",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(tty: bool, reports: &[Progress]) -> String {
        let mut view = ProgressView::new(Vec::new(), tty);
        for &p in reports {
            view.update(p);
        }
        String::from_utf8(view.out).unwrap()
    }

    fn p(phase: Phase, downloaded: u64, total: Option<u64>) -> Progress {
        Progress { downloaded, total, phase }
    }

    /// The odd sequences (no total, a zero total, a phase that never completes) render without
    /// dividing by zero or overflowing the bar.
    #[test]
    fn any_sequence_renders() {
        let odd = [
            p(Phase::Waiting, 0, None),
            p(Phase::Downloading, 0, Some(0)),
            p(Phase::Downloading, 5, None),
            p(Phase::Extracting, 5, Some(10)),
            p(Phase::Extracting, 20, Some(10)),
            p(Phase::Done, 10, Some(10)),
        ];
        for tty in [false, true] {
            let out = render(tty, &odd);
            assert!(out.starts_with("weft: another process is installing the model; waiting for it\n"), "{out:?}");
            assert!(out.ends_with('\n'), "every line is closed: {out:?}");
        }
        let bar = render(true, &odd);
        assert!(bar.contains(&format!("[{}]", "#".repeat(BAR_WIDTH))), "an overshoot fills the bar, no more: {bar:?}");
    }

    #[test]
    fn plain_lines_when_not_a_terminal() {
        let mb = 1_000_000;
        let out = render(
            false,
            &[
                p(Phase::Downloading, 0, Some(2 * mb)),
                p(Phase::Downloading, mb, Some(2 * mb)),
                p(Phase::Downloading, 2 * mb, Some(2 * mb)),
                p(Phase::Downloading, 2 * mb, Some(2 * mb)),
                p(Phase::Extracting, 0, Some(3 * mb)),
                p(Phase::Extracting, 3 * mb, Some(3 * mb)),
                p(Phase::Done, 3 * mb, Some(3 * mb)),
            ],
        );
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 4, "start and end of each phase, once: {out:?}");
        assert_eq!(lines[0], "weft: downloading (2.0 MB)...");
        assert!(lines[1].starts_with("weft: downloading done: 2.0 MB in "), "{out:?}");
        assert_eq!(lines[2], "weft: extracting (3.0 MB)...");
        assert!(lines[3].starts_with("weft: extracting done: 3.0 MB in "), "{out:?}");
        assert!(!out.contains('\r'));
    }

    /// A second batch of downloads (another total) gets its own start and end lines.
    #[test]
    fn a_new_total_starts_a_new_download_line() {
        let mb = 1_000_000;
        let out = render(
            false,
            &[
                p(Phase::Downloading, 0, Some(mb)),
                p(Phase::Downloading, mb, Some(mb)),
                p(Phase::Downloading, 0, Some(5 * mb)),
                p(Phase::Downloading, 5 * mb, Some(5 * mb)),
                p(Phase::Done, 0, None),
            ],
        );
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 4, "{out:?}");
        assert_eq!(lines[2], "weft: downloading (5.0 MB)...");
        assert!(lines[3].starts_with("weft: downloading done: 5.0 MB in "), "{out:?}");
    }

    #[test]
    fn terminal_bar_redraws_one_line_per_phase() {
        let out = render(
            true,
            &[p(Phase::Verifying, 0, Some(4)), p(Phase::Verifying, 1, Some(4)), p(Phase::Verifying, 4, Some(4))],
        );
        assert_eq!(out.matches('\r').count(), 3, "{out:?}");
        assert_eq!(out.matches('\n').count(), 1, "the bar's line is closed when the phase completes: {out:?}");
        assert!(out.contains(" 25% "), "{out:?}");
        assert!(out.contains(&format!("[{}] 100%", "#".repeat(BAR_WIDTH))), "{out:?}");
    }
}
