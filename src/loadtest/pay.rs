//! `stockade loadtest --payments`: every buyer pays through the provider. Without
//! `--target` the load test starts a fresh localstripe beside its servers; with targets it
//! reaches the targets' provider through `STOCKADE_STRIPE_API_BASE` (and reads it, for I9,
//! with `STOCKADE_STRIPE_SECRET_KEY`). After the run, the charges are counted against the
//! orders and I9 is checked.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use serde::Serialize;
use sqlx::PgPool;

use super::check::{Verdict, verdict};
use super::run::PayPlan;
use crate::local::LocalStripe;
use crate::payments::Stripe;

/// The load test's payment options.
#[derive(Debug, Clone, Args, Serialize)]
#[command(next_help_heading = "Payments")]
pub struct PaymentArgs {
    /// Every buyer pays by card through the provider: a hold, its payment, its
    /// confirmation (servers the load test starts take payments through a localstripe it
    /// starts too).
    #[arg(long)]
    pub payments: bool,
    /// Share of paying buyers whose first card is declined (they pay with another).
    #[arg(long, default_value_t = 0.1)]
    pub declined_share: f64,
    /// Share of paying buyers whose card asks for 3-D Secure (which they complete).
    #[arg(long = "3ds-share", default_value_t = 0.1)]
    pub action_share: f64,
    /// The targets' provider, for the buyers' card tokens and 3-D Secure.
    #[arg(long, env = "STOCKADE_STRIPE_API_BASE")]
    pub stripe_api_base: Option<String>,
    /// The publishable key the buyers' "browsers" use.
    #[arg(
        long,
        env = "STOCKADE_STRIPE_PUBLISHABLE_KEY",
        default_value = "pk_test_loadtest"
    )]
    pub publishable_key: String,
    /// The targets' secret key, to read the provider's records for I9.
    #[arg(long, env = "STOCKADE_STRIPE_SECRET_KEY", hide_env_values = true)]
    #[serde(skip)]
    pub stripe_secret_key: Option<String>,
}

/// The keys of a provider the load test starts.
const SECRET: &str = "sk_test_loadtest";
const WEBHOOK_SECRET: &str = "whsec_loadtest";

impl PaymentArgs {
    pub fn validate(&self) -> anyhow::Result<()> {
        for (flag, share) in [
            ("--declined-share", self.declined_share),
            ("--3ds-share", self.action_share),
        ] {
            if !(0.0..=1.0).contains(&share) {
                bail!("{flag} must be between 0 and 1 (got {share})");
            }
        }
        if self.declined_share + self.action_share > 1.0 {
            bail!("--declined-share and --3ds-share add up to more than 1");
        }
        Ok(())
    }

    /// What the buyers need, when they pay.
    pub fn plan(&self) -> Option<PayPlan> {
        self.payments.then(|| PayPlan {
            provider: self.stripe_api_base.clone().unwrap_or_default(),
            publishable_key: self.publishable_key.clone(),
            declined_share: self.declined_share,
            action_share: self.action_share,
        })
    }

    /// The provider's client, to read its records (I9).
    fn stripe(&self) -> anyhow::Result<Stripe> {
        let base = self
            .stripe_api_base
            .as_deref()
            .context("--payments needs the provider's address (STOCKADE_STRIPE_API_BASE)")?;
        let key = self
            .stripe_secret_key
            .clone()
            .context("--payments against targets needs STOCKADE_STRIPE_SECRET_KEY for I9")?;
        Ok(Stripe::new(base, key.into(), Duration::from_secs(10))?)
    }
}

/// A fresh localstripe for servers the load test starts, in `dir`: it, and the servers'
/// payment settings. `args` then names it.
pub fn start_provider(
    dir: &Path,
    args: &mut PaymentArgs,
) -> anyhow::Result<(LocalStripe, Vec<(&'static str, String)>)> {
    let stripe = LocalStripe::start(dir, None, true)?;
    args.stripe_api_base = Some(stripe.url());
    args.stripe_secret_key = Some(SECRET.into());
    let env = vec![
        ("STOCKADE_PAYMENTS", "stripe".to_string()),
        ("STOCKADE_STRIPE_API_BASE", stripe.url()),
        ("STOCKADE_STRIPE_SECRET_KEY", SECRET.into()),
        (
            "STOCKADE_STRIPE_PUBLISHABLE_KEY",
            args.publishable_key.clone(),
        ),
        ("STOCKADE_STRIPE_WEBHOOK_SECRET", WEBHOOK_SECRET.into()),
        ("STOCKADE_PAYMENT_RECONCILE_MS", "2000".into()),
    ];
    Ok((stripe, env))
}

/// Has `stripe` send its events to `server`.
pub async fn register_webhook(stripe: &LocalStripe, server: &str) -> anyhow::Result<()> {
    stripe
        .register_webhook(&format!("{server}/webhooks/stripe"), WEBHOOK_SECRET)
        .await
}

/// What moved: charges against orders.
#[derive(Debug, Clone, Default, Serialize, sqlx::FromRow)]
pub struct PaymentTally {
    /// Payments captured (charged).
    pub captured: i64,
    /// Orders placed from paid holds.
    pub paid_orders: i64,
    /// Captured payments refunded.
    pub refunded: i64,
    /// Authorizations released (cancelled), nothing charged.
    pub released: i64,
    /// Cards declined along the way.
    pub declined: i64,
}

/// Waits (up to a minute) for every payment of `db` to settle, as the reconciler settles
/// them after the run; then counts them, and checks I9 against the provider.
pub async fn after_run(db: &PgPool, args: &PaymentArgs) -> anyhow::Result<(PaymentTally, Verdict)> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let open: i64 = sqlx::query_scalar(
            "select count(*) from payments p join orders o on o.id = p.order_id
              where o.status = 'placed' and p.status <> 'succeeded'",
        )
        .fetch_one(db)
        .await?;
        if open == 0 || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let tally: PaymentTally = sqlx::query_as(
        "select count(*) filter (where captured_cents is not null) as captured,
                count(*) filter (where order_id is not null and o.status = 'placed') as paid_orders,
                count(*) filter (where refund_id is not null) as refunded,
                count(*) filter (where p.status = 'canceled') as released,
                coalesce(sum(attempt), 0)::bigint as declined
           from payments p left join orders o on o.id = p.order_id",
    )
    .fetch_one(db)
    .await?;
    let rows = crate::payments::audit::i9_rows(db, &args.stripe()?, Duration::ZERO).await?;
    Ok((tally, verdict("I9", rows)))
}

/// The terminal line for a run's payments.
pub fn summary(strategy: &str, tally: &PaymentTally) -> String {
    format!(
        "{strategy}: payments: {} captured for {} paid orders; {} refunded; {} authorizations \
         released; {} cards declined on the way\n",
        tally.captured, tally.paid_orders, tally.refunded, tally.released, tally.declined
    )
}
