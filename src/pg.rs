//! PostgreSQL's answers that callers at every layer ask about: which failures a retry may
//! not meet. Below the domain modules, so that they and [`crate::error`] can both ask.

/// Database failures that load or a passing fault causes, and a retry may not meet: no
/// free connection, a timeout, a lock or serialisation conflict, a dropped connection.
pub fn is_transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) => true,
        sqlx::Error::Database(db) => matches!(
            db.code().as_deref(),
            // query_canceled (statement timeout), lock_not_available, serialization_failure,
            // deadlock_detected, too_many_connections, idle-in-transaction timeout,
            // admin_shutdown, cannot_connect_now
            Some("57014" | "55P03" | "40001" | "40P01" | "53300" | "25P03" | "57P01" | "57P03")
        ),
        _ => false,
    }
}

/// Failures that mean the server is out of reach (stopped, restarting, or the network
/// gone), not that the statement failed: a dropped connection, or the server shutting down
/// or starting up. (No connection within the pool's wait is not among them: that is as
/// often a busy server as a gone one.)
pub fn is_unreachable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::PoolClosed | sqlx::Error::Io(_) => true,
        // admin_shutdown, crash_shutdown, cannot_connect_now, and class 08 (connection
        // exception)
        sqlx::Error::Database(db) => db.code().is_some_and(|c| {
            matches!(c.as_ref(), "57P01" | "57P02" | "57P03") || c.starts_with("08")
        }),
        _ => false,
    }
}
