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
