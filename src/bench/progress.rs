//! A progress bar over a phase of the bench, showing answers and their rate.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::load::Live;

/// A progress bar over a phase's duration, showing answers and their rate.
pub(super) struct Progress {
    bar: Option<indicatif::ProgressBar>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Progress {
    pub(super) fn start(quiet: bool, label: String, duration: Duration, live: Arc<Live>) -> Self {
        if quiet {
            return Self {
                bar: None,
                task: None,
            };
        }
        let bar = indicatif::ProgressBar::new(duration.as_millis() as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{prefix:>44} [{elapsed_precise}] {bar:30.green/white} {msg}",
            )
            .expect("valid template")
            .progress_chars("█▉ "),
        );
        bar.set_prefix(label);
        let shown = bar.clone();
        let started = Instant::now();
        let task = tokio::spawn(async move {
            loop {
                let elapsed = started.elapsed();
                let answers = live.answers.load(Ordering::Relaxed);
                shown.set_position((elapsed.as_millis() as u64).min(duration.as_millis() as u64));
                if answers > 0 {
                    shown.set_message(format!(
                        "{answers} answers · {:.0}/s",
                        answers as f64 / elapsed.as_secs_f64().max(1e-3)
                    ));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Self {
            bar: Some(bar),
            task: Some(task),
        }
    }

    pub(super) fn finish(self) {
        if let Some(task) = self.task {
            task.abort();
        }
        if let Some(bar) = self.bar {
            bar.finish_and_clear();
        }
    }
}
