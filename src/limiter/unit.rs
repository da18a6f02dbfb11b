//! The named window lengths Envoy reports in `current_limit.unit`
//! (`SECOND` … `YEAR`), below both the request (a caller's own limit) and
//! the rules (a limit's window).

/// The unit reported back to Envoy in `current_limit.unit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unit {
    /// The window is not one of the named units (for example `5m`).
    Unknown,
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

/// The named lengths, in milliseconds.
pub const SECOND: u64 = 1_000;
pub const MINUTE: u64 = 60 * SECOND;
pub const HOUR: u64 = 60 * MINUTE;
pub const DAY: u64 = 24 * HOUR;
pub const WEEK: u64 = 7 * DAY;
/// envoyproxy/ratelimit's month and year are fixed lengths, not calendar ones.
pub const MONTH: u64 = 30 * DAY;
pub const YEAR: u64 = 365 * DAY;
/// The longest duration accepted: 100 years. Times and windows are added
/// as signed milliseconds (and as doubles in Redis's scripts, exact below
/// 2^53); a window near u64::MAX wrapped the arithmetic.
pub const MAX_DURATION_MS: u64 = 100 * YEAR;

const NAMED: [(&str, Unit, u64); 7] = [
    ("second", Unit::Second, SECOND),
    ("minute", Unit::Minute, MINUTE),
    ("hour", Unit::Hour, HOUR),
    ("day", Unit::Day, DAY),
    ("week", Unit::Week, WEEK),
    ("month", Unit::Month, MONTH),
    ("year", Unit::Year, YEAR),
];

impl Unit {
    /// The named unit whose length is exactly `ms`, if any.
    pub fn of_window(ms: u64) -> Unit {
        NAMED
            .iter()
            .find(|(_, _, len)| *len == ms)
            .map_or(Unit::Unknown, |(_, u, _)| *u)
    }

    /// The name Envoy's protobuf enums use: `SECOND`, `MINUTE`, …, `UNKNOWN`.
    pub fn proto_name(self) -> &'static str {
        match self {
            Unit::Unknown => "UNKNOWN",
            Unit::Second => "SECOND",
            Unit::Minute => "MINUTE",
            Unit::Hour => "HOUR",
            Unit::Day => "DAY",
            Unit::Week => "WEEK",
            Unit::Month => "MONTH",
            Unit::Year => "YEAR",
        }
    }

    /// The named unit for a protobuf enum name (any case); `None` for
    /// `UNKNOWN` or anything else.
    pub fn from_proto_name(name: &str) -> Option<Unit> {
        NAMED
            .iter()
            .find(|(n, _, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, u, _)| *u)
    }

    /// The length of a named unit in milliseconds.
    pub fn millis(self) -> Option<u64> {
        NAMED
            .iter()
            .find(|(_, u, _)| *u == self)
            .map(|(_, _, len)| *len)
    }
}
