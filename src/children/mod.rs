//! The processes Stockade starts (servers in local mode, the cluster's daemons, the
//! bench's and the load test's apps, the test harness's servers), and three promises about
//! them:
//!
//! - [`ports`]: no two of them are ever given one port. A port is claimed for the life of
//!   the process that drew it, with a lock other Stockade processes respect, and drawn
//!   outside the kernel's range for outgoing connections, so neither a sibling daemon nor a
//!   client socket can take it between the draw and the daemon's bind.
//! - [`warden`]: none of them outlives the process that started it, however that process
//!   ends (SIGKILL included). Every child carries a mark in its environment, which its own
//!   children inherit; a watcher process wakes when its parent's end closes a pipe, and
//!   kills every process still carrying the parent's mark.
//! - [`started`]: a daemon that exits while Stockade waits for it fails the wait at once,
//!   naming the daemon and quoting the end of its log, instead of leaving the wait to run
//!   into its deadline (or, with no deadline, forever).
//! - [`running`]: each started server is stopped with its own signal when its owner is
//!   dropped.

pub mod ports;
pub mod running;
pub mod started;
pub mod warden;

pub use ports::free_port;
pub use running::{Running, stop_child};
pub use started::{alive, check_alive, exited, log_tail};
pub use warden::{mark, mark_tokio};
