//! Local mode's payment provider: localstripe, a Stripe-compatible server with test cards
//! and signed webhooks, run from the project's virtualenv (`make deps-localstripe`) as a
//! process of its own (never linked). Tests start one per test, fresh.

use crate::children::Running;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::signal::Signal;

use crate::config::{PaymentsMode, Settings};

/// The test cards local mode prints beside the admin login.
const TEST_CARDS: &[(&str, &str)] = &[
    ("4242424242424242", "paid"),
    ("4000000000000341", "declined"),
    ("4000000000003220", "asks for 3-D Secure (then paid)"),
];

/// A running localstripe owned by this process.
#[derive(Debug)]
pub struct LocalStripe {
    process: Running,
    pub port: u16,
    log: PathBuf,
}

/// Where localstripe is: `STOCKADE_LOCALSTRIPE`, else the project's `.venv/`, else `PATH`.
fn binary() -> anyhow::Result<PathBuf> {
    if let Some(given) = std::env::var_os("STOCKADE_LOCALSTRIPE") {
        return Ok(given.into());
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/localstripe");
    if venv.is_file() {
        return Ok(venv);
    }
    super::find_binary("localstripe").context(
        "localstripe not found: `make deps-localstripe` installs it into .venv/ \
         (or set STOCKADE_LOCALSTRIPE to its path)",
    )
}

impl LocalStripe {
    /// Starts localstripe on `port` (a free one when `None`), its log in `dir`. `fresh`:
    /// with an empty store (it otherwise reloads what it last wrote, which it keeps in
    /// `/tmp/localstripe.pickle` whatever it is told: one file for every localstripe on the
    /// machine, so local mode and the tests always start fresh).
    pub fn start(dir: &Path, port: Option<u16>, fresh: bool) -> anyhow::Result<Self> {
        let bin = binary()?;
        std::fs::create_dir_all(dir)?;
        let port = match port {
            Some(port) => port,
            None => super::free_port()?,
        };
        let log = dir.join("localstripe.log");
        let out = std::fs::File::create(&log)
            .with_context(|| format!("cannot write {}", log.display()))?;
        let mut cmd = Command::new(&bin);
        cmd.args(["--port", &port.to_string()]);
        if fresh {
            cmd.arg("--from-scratch");
        }
        cmd.stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        let child = crate::children::mark(&mut cmd)
            .spawn()
            .with_context(|| format!("could not start {}", bin.display()))?;
        let mut stripe = Self {
            process: Running::new(child, "localstripe", Signal::SIGTERM),
            port,
            log,
        };
        stripe.wait_until_accepting()?;
        Ok(stripe)
    }

    /// Local mode's provider, when the shop takes payments and no provider is set up: a
    /// fresh localstripe in the data folder, which `settings` then name (with keys made up
    /// for it).
    pub async fn for_local_mode(settings: &mut Settings) -> anyhow::Result<Option<Self>> {
        if settings.payments != PaymentsMode::Stripe || settings.stripe_secret_key.is_some() {
            return Ok(None);
        }
        let dir = settings.data_dir.join("localstripe");
        let stripe = tokio::task::spawn_blocking(move || Self::start(&dir, None, true)).await??;
        settings.stripe_api_base = stripe.url();
        settings.stripe_secret_key = Some("sk_test_local".into());
        settings.stripe_publishable_key = Some("pk_test_local".into());
        let secret = format!("whsec_{}", uuid::Uuid::new_v4().simple());
        settings.stripe_webhook_secret = Some(secret.into());
        Ok(Some(stripe))
    }

    /// Sends its events to the shop at `shop` (signed with `secret`); what local mode
    /// prints about it: where it is, and the test cards.
    pub async fn serve(&self, shop: &str, secret: &str) -> anyhow::Result<String> {
        self.register_webhook(&format!("{shop}/webhooks/stripe"), secret)
            .await?;
        let mut said = format!(
            "  Payments:    localstripe at {} (test cards, any future date and CVC):\n",
            self.url()
        );
        for (number, what) in TEST_CARDS {
            said.push_str(&format!("                 {number}  {what}\n"));
        }
        Ok(said)
    }

    /// `http://127.0.0.1:port`: `STOCKADE_STRIPE_API_BASE`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn wait_until_accepting(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(child) = self.process.child() {
                crate::children::exited("localstripe", child, &self.log)?;
            }
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "localstripe did not accept connections on port {} within 30 s:\n{}",
                    self.port,
                    crate::children::log_tail(&self.log, 20)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Has localstripe send its events for every intent to `url`, signed with `secret`.
    pub async fn register_webhook(&self, url: &str, secret: &str) -> anyhow::Result<()> {
        let answer = reqwest::Client::new()
            .post(format!("{}/_config/webhooks/stockade", self.url()))
            .timeout(Duration::from_secs(10))
            .form(&[("url", url), ("secret", secret)])
            .send()
            .await
            .context("localstripe did not answer the webhook registration")?;
        if !answer.status().is_success() {
            bail!(
                "localstripe refused the webhook registration: {} {}",
                answer.status(),
                answer.text().await.unwrap_or_default()
            );
        }
        Ok(())
    }

    /// Kills it at once (SIGKILL), as a crash would.
    pub fn kill9(&mut self) {
        self.process.kill9();
    }

    pub fn stop(&mut self) {
        self.process.stop();
    }
}
