//! Backups with point-in-time recovery, by pgBackRest.
//!
//! With `--backups DIR`, local mode's PostgreSQL (and `stockade cluster`'s primary)
//! archives every finished WAL segment into a pgBackRest repository in `DIR` — its
//! `archive_command` returns only once pgBackRest has the segment — and a full backup is
//! taken at start when the repository has none. A backup plus the WAL archived after it
//! can rebuild the database as of any moment since: [`Repo::restore`] has pgBackRest copy
//! the backup into a new folder and PostgreSQL replay the archive up to that moment.
//!
//! `DIR` holds everything: `pgbackrest.conf` (rewritten at every start: the port may
//! change), the repository (`repo/`), pgBackRest's logs and locks, the server's socket
//! (pgBackRest reaches PostgreSQL only through one), and `pgpass`, the password of the
//! superuser (the repository holds the whole database anyway: guard `DIR` as you would
//! the data). Every file there belongs to the user PostgreSQL runs as.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use chrono::{DateTime, Utc};
use nix::sys::signal::Signal;
use nix::unistd::User;
use serde::Deserialize;

use super::{
    MAX_CONNECTIONS, PG_USER, find_binary, free_port, postgres_bin_dir, private_dir, reachable,
    run_as, service_user, write_private,
};

/// The one stanza (pgBackRest's name for a database cluster) a repository here holds.
pub const STANZA: &str = "stockade";

/// Full backups kept; older ones, and the WAL only they need, are expired by the next
/// backup. Two: a restore can reach back past the latest full one.
const RETAINED_FULL: u32 = 2;

/// Forces a WAL segment switch after this long with writes: the most an idle shop's
/// archive lags behind its last commit.
pub const ARCHIVE_TIMEOUT_S: u32 = 60;

/// What kind of backup to take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// Every file of the cluster.
    Full,
    /// The files changed since the last full backup.
    Diff,
    /// The files changed since the last backup of any kind.
    Incr,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Full => "full",
            Self::Diff => "diff",
            Self::Incr => "incr",
        }
    }
}

/// One backup in the repository, as `pgbackrest info` describes it.
#[derive(Debug, Clone)]
pub struct BackupSet {
    pub label: String,
    pub kind: String,
    pub started: DateTime<Utc>,
    pub stopped: DateTime<Utc>,
    /// The database's size.
    pub database_bytes: u64,
    /// What the backup adds to the repository (compressed, without the files it shares).
    pub stored_bytes: u64,
}

/// A PostgreSQL server a repository backs up, as pgBackRest reaches it: by its socket.
#[derive(Debug, Clone)]
pub struct Server {
    pub data_dir: PathBuf,
    pub port: u16,
    pub socket_dir: PathBuf,
}

/// A pgBackRest repository in a folder of its own.
#[derive(Debug)]
pub struct Repo {
    dir: PathBuf,
    owner: Option<User>,
    pgbackrest: PathBuf,
}

impl Repo {
    /// Opens (creating) the repository folder `dir`, owned by the user PostgreSQL runs as.
    pub fn open(dir: &Path) -> anyhow::Result<Self> {
        let pgbackrest = find_binary("pgbackrest").context(
            "pgBackRest is not installed (Debian/Ubuntu: apt-get install pgbackrest); \
             --backups needs it",
        )?;
        let owner = service_user()?;
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let dir = dir.canonicalize()?;
        let text = dir.to_string_lossy();
        if text.contains(['"', '\'', '\\', '$', '`', '%']) || text.contains(char::is_whitespace) {
            bail!(
                "the backup folder {} has a space, quote, $, `, % or backslash in its \
                 path; PostgreSQL's archive_command could not name it safely",
                dir.display()
            );
        }
        if let Some(owner) = &owner
            && !reachable(&dir, owner)
        {
            bail!(
                "the backup folder {} is not reachable by the user PostgreSQL runs as ({}); \
                 choose one that user can reach, such as /var/lib/stockade/backups",
                dir.display(),
                owner.name,
            );
        }
        // A folder of someone else's is never taken over: only a new (empty) one, or one
        // this set up before.
        let set_up = dir.join("pgbackrest.conf").is_file();
        if !set_up && fs::read_dir(&dir)?.next().is_some() {
            bail!(
                "{} is neither empty nor a backup folder (it has no pgbackrest.conf); \
                 give backups a folder of their own",
                dir.display()
            );
        }
        // PostgreSQL's socket for pgBackRest: `<dir>/socket/.s.PGSQL.<port>`, at most 107
        // bytes.
        if text.len() + "/socket/.s.PGSQL.65535".len() > 107 {
            bail!(
                "the backup folder's path {} is too long for the socket PostgreSQL opens \
                 in it (at most {} characters)",
                dir.display(),
                107 - "/socket/.s.PGSQL.65535".len()
            );
        }
        let repo = Self {
            dir,
            owner,
            pgbackrest,
        };
        if !set_up {
            fs::set_permissions(&repo.dir, fs::Permissions::from_mode(0o700))?;
            repo.own_dir(&repo.dir)?;
        }
        for sub in [repo.socket_dir(), repo.dir.join("log")] {
            if !sub.exists() {
                repo.own_dir(&sub)?;
            }
        }
        Ok(repo)
    }

    /// Opens the repository folder a server set up (`--backups DIR`), for the `stockade
    /// backup` commands: unlike [`Repo::open`], never creates one.
    pub fn existing(dir: &Path) -> anyhow::Result<Self> {
        if !dir.join("pgbackrest.conf").is_file() {
            bail!(
                "{} is not a backup folder (it has no pgbackrest.conf); give the folder \
                 passed to `stockade serve --backups` or `stockade cluster --backups`",
                dir.display()
            );
        }
        Self::open(dir)
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn socket_dir(&self) -> PathBuf {
        self.dir.join("socket")
    }

    fn own_dir(&self, dir: &Path) -> anyhow::Result<()> {
        fs::create_dir_all(dir)?;
        if let Some(owner) = &self.owner {
            nix::unistd::chown(dir, Some(owner.uid), Some(owner.gid))?;
        }
        Ok(())
    }

    /// Writes `pgbackrest.conf` and `pgpass` for the server with its data in `data_dir`,
    /// listening on `port`, reached through the repository's own socket folder.
    pub fn configure(
        &self,
        data_dir: &Path,
        port: u16,
        password: Option<&str>,
    ) -> anyhow::Result<()> {
        let server = Server {
            data_dir: data_dir.to_path_buf(),
            port,
            socket_dir: self.socket_dir(),
        };
        self.configure_servers(&[server], PG_USER, password)
    }

    /// Writes `pgbackrest.conf` and `pgpass` for one database cluster run by several
    /// servers, of which one is primary at a time (Patroni's nodes): pgBackRest finds which
    /// when it backs up, and whichever is primary archives its WAL. `user` is a superuser.
    pub fn configure_servers(
        &self,
        servers: &[Server],
        user: &str,
        password: Option<&str>,
    ) -> anyhow::Result<()> {
        // One database per folder: two would archive into one stanza, and each start would
        // point the other's archiving and backups at itself.
        let earlier = fs::read_to_string(self.dir.join("pgbackrest.conf")).unwrap_or_default();
        if let Some(other) = earlier
            .lines()
            .find_map(|l| l.strip_prefix("pg1-path="))
            .map(Path::new)
            && servers.iter().all(|s| s.data_dir != other)
            && other.join("PG_VERSION").exists()
        {
            bail!(
                "{} keeps the backups of the database in {}; give this one a backup \
                 folder of its own",
                self.dir.display(),
                other.display()
            );
        }
        let dir = self.dir.display();
        let mut conf = format!(
            "# Written by Stockade at every start of the server it backs up.\n\
             [global]\n\
             repo1-path={dir}/repo\n\
             repo1-retention-full={RETAINED_FULL}\n\
             compress-type=lz4\n\
             start-fast=y\n\
             process-max=2\n\
             log-path={dir}/log\n\
             lock-path={dir}/lock\n\
             log-level-console=warn\n\
             log-level-file=info\n\
             \n\
             [{STANZA}]\n"
        );
        for (i, server) in servers.iter().enumerate() {
            let n = i + 1;
            conf.push_str(&format!(
                "pg{n}-path={}\n\
                 pg{n}-port={}\n\
                 pg{n}-socket-path={}\n\
                 pg{n}-user={user}\n\
                 pg{n}-database=postgres\n",
                server.data_dir.display(),
                server.port,
                server.socket_dir.display(),
            ));
        }
        self.write_owned("pgbackrest.conf", &conf)?;
        // libpq's password file: pgBackRest has no password setting of its own.
        self.write_owned(
            "pgpass",
            &format!("*:*:*:{user}:{}\n", password.unwrap_or_default()),
        )
    }

    fn write_owned(&self, name: &str, content: &str) -> anyhow::Result<()> {
        let path = self.dir.join(name);
        write_private(&path, content)?;
        if let Some(owner) = &self.owner {
            nix::unistd::chown(&path, Some(owner.uid), Some(owner.gid))?;
        }
        Ok(())
    }

    /// The settings that make PostgreSQL archive its WAL here. With several servers
    /// ([`Repo::configure_servers`]), `data_dir` names the one these settings are for:
    /// pgBackRest's `archive-push` checks that it runs in `pg1-path`.
    pub fn archive_settings(&self, data_dir: Option<&Path>) -> [(&'static str, String); 3] {
        let mut archive = format!(
            "{} --config-path={} --stanza={STANZA}",
            self.pgbackrest.display(),
            self.dir.display()
        );
        if let Some(dir) = data_dir {
            archive.push_str(&format!(" --pg1-path={}", dir.display()));
        }
        archive.push_str(" archive-push %p");
        [
            ("archive_mode", "on".to_string()),
            ("archive_command", archive),
            ("archive_timeout", ARCHIVE_TIMEOUT_S.to_string()),
        ]
    }

    /// The settings that make PostgreSQL archive its WAL here and open the socket
    /// pgBackRest connects through, as `-c` arguments.
    pub fn server_settings(&self) -> Vec<String> {
        let socket = (
            "unix_socket_directories",
            self.socket_dir().display().to_string(),
        );
        self.archive_settings(None)
            .into_iter()
            .chain([socket])
            .flat_map(|(name, value)| ["-c".to_string(), format!("{name}={value}")])
            .collect()
    }

    /// Once the server is up: creates the stanza (kept when it exists) and takes a full
    /// backup unless the repository has one.
    pub fn prepare(&self) -> anyhow::Result<()> {
        self.run(&["stanza-create"], "could not set up the backup repository")?;
        if self.list()?.is_empty() {
            tracing::info!(dir = %self.dir.display(), "taking the first full backup");
            self.take(Kind::Full)?;
        }
        Ok(())
    }

    /// Takes a backup of the running server; returns it.
    pub fn take(&self, kind: Kind) -> anyhow::Result<BackupSet> {
        self.run(
            &["backup", &format!("--type={}", kind.as_str())],
            "the backup failed (is the server started with this --backups folder running?)",
        )?;
        self.list()?
            .pop()
            .context("pgBackRest reported success but lists no backup")
    }

    /// The repository's backups, oldest first.
    pub fn list(&self) -> anyhow::Result<Vec<BackupSet>> {
        let out = self.run(
            &["info", "--output=json"],
            "could not read the backup repository",
        )?;
        parse_info(&out)
    }

    /// Rebuilds the cluster into `data_dir` (which must not hold one) as of `to`, or of the
    /// end of the archive, and runs its recovery to the end; the folder is then a normal,
    /// stopped cluster that `stockade serve --data-dir` starts. Returns the recovery's
    /// last log lines about where it stopped.
    pub fn restore(
        &self,
        data_dir: &Path,
        to: Option<DateTime<Utc>>,
    ) -> anyhow::Result<Vec<String>> {
        fs::create_dir_all(data_dir)
            .with_context(|| format!("cannot create {}", data_dir.display()))?;
        let data_dir = data_dir.canonicalize()?;
        let wanted = data_dir.join("postgres");
        if wanted.join("PG_VERSION").exists() {
            bail!(
                "{} already holds a database; restore into a new folder",
                wanted.display()
            );
        }
        let pg_dir = private_dir(&wanted, self.owner.as_ref())?;
        if fs::read_dir(&pg_dir)?.next().is_some() {
            bail!(
                "{} is not empty (what an interrupted restore left?); remove it or \
                 restore into a new folder",
                pg_dir.display()
            );
        }
        let mut args = vec![
            "restore".to_string(),
            format!("--pg1-path={}", pg_dir.display()),
            // The copy must not archive into the repository of the server it came from.
            "--archive-mode=off".to_string(),
        ];
        if let Some(to) = to {
            args.extend([
                "--type=time".to_string(),
                format!("--target={}", to.format("%Y-%m-%d %H:%M:%S%.6f+00")),
                "--target-action=promote".to_string(),
            ]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let restored = self
            .run(&args, "the restore failed")
            .and_then(|_| self.recover(&pg_dir));
        let stopped = match restored {
            Ok(stopped) => stopped,
            Err(e) => {
                // Nothing half-restored stays behind: the folder was empty.
                let _ = fs::remove_dir_all(&pg_dir);
                return Err(e);
            }
        };
        // `stockade serve --data-dir` finds the superuser's password beside the folder.
        let pgpass = fs::read_to_string(self.dir.join("pgpass")).unwrap_or_default();
        if let Some(password) = pgpass.trim().rsplit(':').next().filter(|p| !p.is_empty()) {
            write_private(&data_dir.join("postgres.password"), password)?;
        }
        Ok(stopped)
    }

    /// Starts PostgreSQL on a restored folder, waits until its recovery has replayed the
    /// archive to the target and it has been promoted, and stops it.
    fn recover(&self, pg_dir: &Path) -> anyhow::Result<Vec<String>> {
        let bin = postgres_bin_dir()?;
        let log_path = pg_dir.join("postgres.log");
        let log = fs::File::create(&log_path).context("postgres.log")?;
        if let Some(owner) = &self.owner {
            nix::unistd::chown(&log_path, Some(owner.uid), Some(owner.gid))?;
        }
        let mut cmd = Command::new(bin.join("postgres"));
        cmd.arg("-D")
            .arg(pg_dir)
            .args(["-p", &free_port()?.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "unix_socket_directories="])
            .args(["-c", "archive_mode=off"])
            .args(["-c", &format!("max_connections={MAX_CONNECTIONS}")])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // In this command's process group: Ctrl-C stops the recovery with it.
        run_as(&mut cmd, self.owner.as_ref());
        let mut child = crate::children::mark(&mut cmd)
            .spawn()
            .context("could not start postgres on the restored folder")?;
        // Replaying WAL takes as long as it takes; recovery that runs out of archive ends
        // by itself (below), and its log shows how far it got.
        loop {
            let text = fs::read_to_string(&log_path).unwrap_or_default();
            if text
                .lines()
                .any(|l| l.ends_with("database system is ready to accept connections"))
            {
                crate::children::stop_child(child, Signal::SIGINT, "postgres");
                return Ok(text
                    .lines()
                    .filter(|l| {
                        l.contains("recovery stopping")
                            || l.contains("last completed transaction")
                            || l.contains("redo done")
                    })
                    .map(String::from)
                    .collect());
            }
            if let Some(status) = child.try_wait()? {
                if text.contains("recovery ended before configured recovery target") {
                    let last = text
                        .lines()
                        .find_map(|l| l.split_once("last completed transaction was at log time "))
                        .map_or("", |(_, at)| at);
                    bail!(
                        "the archive does not reach that moment yet (its last transaction \
                         is from {last}). A WAL segment is archived when it fills, and at \
                         most {ARCHIVE_TIMEOUT_S} s after a write; wait, then restore again"
                    );
                }
                let why: Vec<&str> = text
                    .lines()
                    .filter(|l| l.contains("FATAL") || l.contains("ERROR"))
                    .collect();
                bail!(
                    "the restored database's recovery stopped ({status}):\n{}",
                    why.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs one pgBackRest command as the repository's owner; its standard output.
    fn run(&self, args: &[&str], failed: &str) -> anyhow::Result<String> {
        let mut cmd = Command::new(&self.pgbackrest);
        cmd.arg(format!("--config-path={}", self.dir.display()))
            .arg(format!("--stanza={STANZA}"))
            .args(args)
            .env("PGPASSFILE", self.dir.join("pgpass"))
            .current_dir(&self.dir)
            .stdin(Stdio::null());
        run_as(&mut cmd, self.owner.as_ref());
        let out = crate::children::mark(&mut cmd)
            .output()
            .with_context(|| format!("could not run {}", self.pgbackrest.display()))?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let stdout = String::from_utf8_lossy(&out.stdout);
            bail!(
                "{failed}: pgbackrest {}: {}{}",
                args.first().unwrap_or(&""),
                stderr.trim(),
                stdout.trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// `pgbackrest info --output=json`: one entry per stanza.
#[derive(Deserialize)]
struct StanzaInfo {
    #[serde(default)]
    backup: Vec<BackupInfo>,
}

#[derive(Deserialize)]
struct BackupInfo {
    label: String,
    #[serde(rename = "type")]
    kind: String,
    timestamp: Span,
    info: Sizes,
}

#[derive(Deserialize)]
struct Span {
    start: i64,
    stop: i64,
}

#[derive(Deserialize)]
struct Sizes {
    size: u64,
    repository: StoredSize,
}

#[derive(Deserialize)]
struct StoredSize {
    delta: u64,
}

fn parse_info(json: &str) -> anyhow::Result<Vec<BackupSet>> {
    let stanzas: Vec<StanzaInfo> =
        serde_json::from_str(json).context("pgbackrest info printed something unexpected")?;
    let time = |s: i64| DateTime::from_timestamp(s, 0).unwrap_or_default();
    Ok(stanzas
        .into_iter()
        .flat_map(|s| s.backup)
        .map(|b| BackupSet {
            label: b.label,
            kind: b.kind,
            started: time(b.timestamp.start),
            stopped: time(b.timestamp.stop),
            database_bytes: b.info.size,
            stored_bytes: b.info.repository.delta,
        })
        .collect())
}
