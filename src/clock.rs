//! The shop's time zone (`STOCKADE_TIME_ZONE`): every time a person reads is shown in it,
//! with the zone's abbreviation ("18:00 CET"), and the drop form's date and time is read in
//! it. Set once per process, when the app is built (as the currency is), because the
//! templates that show times have no settings at hand.

use std::sync::OnceLock;

use chrono::{DateTime, NaiveDateTime, TimeZone, Utc};
use chrono_tz::Tz;

static ZONE: OnceLock<Tz> = OnceLock::new();

/// A moment in time, however a template holds it (a field, or a reference to one bound by
/// `if let`).
pub trait Moment {
    fn utc(&self) -> DateTime<Utc>;
}

impl Moment for DateTime<Utc> {
    fn utc(&self) -> DateTime<Utc> {
        *self
    }
}

impl<T: Moment + ?Sized> Moment for &T {
    fn utc(&self) -> DateTime<Utc> {
        (**self).utc()
    }
}

/// The shop's zone, from the settings; the first app built in a process fixes it.
pub fn set_zone(zone: Tz) {
    let _ = ZONE.set(zone);
}

/// The shop's zone (UTC until set).
pub fn zone() -> Tz {
    ZONE.get().copied().unwrap_or(chrono_tz::UTC)
}

/// `at` in the shop's zone as `format` writes it; `%Z` is the zone's abbreviation then.
pub fn show(at: impl Moment, format: &str) -> String {
    at.utc().with_timezone(&zone()).format(format).to_string()
}

/// A date and time: `2026-12-24 18:00 CET`.
pub fn date_time(at: impl Moment) -> String {
    show(at, "%Y-%m-%d %H:%M %Z")
}

/// A date and time to the second: `2026-12-24 18:00:05 CET`.
pub fn date_time_seconds(at: impl Moment) -> String {
    show(at, "%Y-%m-%d %H:%M:%S %Z")
}

/// A time of day: `18:00 CET`.
pub fn time(at: impl Moment) -> String {
    show(at, "%H:%M %Z")
}

/// A time of day to the second: `18:00:05 CET`.
pub fn time_seconds(at: impl Moment) -> String {
    show(at, "%H:%M:%S %Z")
}

/// The zone's abbreviation now, for a column heading: "Placed (CET)".
pub fn abbreviation() -> String {
    show(Utc::now(), "%Z")
}

/// `local`, a date and time in the shop's zone (a `datetime-local` field), as UTC; `None`
/// for one the zone skips or repeats (a clock change), which cannot be told apart.
pub fn from_local(local: NaiveDateTime) -> Option<DateTime<Utc>> {
    zone()
        .from_local_datetime(&local)
        .single()
        .map(|t| t.with_timezone(&Utc))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zone_shows_its_abbreviation_and_reads_local_times() {
        let berlin: Tz = "Europe/Berlin".parse().unwrap();
        let at = Utc.with_ymd_and_hms(2026, 12, 24, 17, 0, 0).unwrap();
        assert_eq!(
            at.with_timezone(&berlin).format("%H:%M %Z").to_string(),
            "18:00 CET"
        );
        let local = chrono::NaiveDate::from_ymd_opt(2026, 12, 24)
            .unwrap()
            .and_hms_opt(18, 0, 0)
            .unwrap();
        assert_eq!(
            berlin
                .from_local_datetime(&local)
                .single()
                .unwrap()
                .with_timezone(&Utc),
            at
        );
        // The hour skipped when the clocks go forward does not exist.
        let skipped = chrono::NaiveDate::from_ymd_opt(2027, 3, 28)
            .unwrap()
            .and_hms_opt(2, 30, 0)
            .unwrap();
        assert!(berlin.from_local_datetime(&skipped).single().is_none());
    }
}
