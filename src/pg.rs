//! PostgreSQL's answers that callers at every layer ask about: which failures a retry may
//! not meet. Below the domain modules, so that they and [`crate::error`] can both ask.

/// Database failures that load or a passing fault causes, and a retry may not meet: no
/// free connection, a timeout, a lock or serialisation conflict, the server out of reach.
pub fn is_transient(e: &sqlx::Error) -> bool {
    is_unreachable(e)
        || match e {
            sqlx::Error::PoolTimedOut => true,
            sqlx::Error::Database(db) => matches!(
                db.code().as_deref(),
                // query_canceled (statement timeout), lock_not_available,
                // serialization_failure, deadlock_detected, too_many_connections,
                // idle-in-transaction timeout
                Some("57014" | "55P03" | "40001" | "40P01" | "53300" | "25P03")
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
        sqlx::Error::Database(db) => matches!(
            db.code().as_deref(),
            // admin_shutdown, crash_shutdown, cannot_connect_now; connection_exception,
            // sqlclient_unable_to_establish_sqlconnection, connection_does_not_exist,
            // sqlserver_rejected_establishment_of_sqlconnection, connection_failure
            Some("57P01" | "57P02" | "57P03" | "08000" | "08001" | "08003" | "08004" | "08006")
        ),
        _ => false,
    }
}
