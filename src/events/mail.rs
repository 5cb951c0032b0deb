//! Receipts by email. An `order.placed` event with an email becomes a `mail` delivery;
//! the dispatcher renders the receipt (text and HTML, from askama templates) and hands it
//! to SMTP (`STOCKADE_SMTP_URL`, through `lettre`) or, without SMTP, writes it as an
//! `.eml` file into a folder (`STOCKADE_MAIL_DIR`; local mode uses `mail/` in its data
//! folder), which the admin's webhooks page lists.
//!
//! Delivery is at least once: the message's `Message-ID` is derived from the event id,
//! so a receipt sent twice (a dispatcher died after SMTP accepted it) is the same message
//! to mail clients, and the folder keeps one file per event.
//!
//! A receipt is rendered from the event's payload (a [`Receipt`]), the same document a
//! webhook receiver gets, not from the order's row: mail is one more receiver.

use std::path::{Path, PathBuf};

use askama::Template;
use lettre::message::{Mailbox, MultiPart};
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use uuid::Uuid;

use crate::catalog::format_cents;
use crate::config::Settings;

/// An `order.placed` payload, as much of it as a receipt shows.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Receipt {
    pub id: Uuid,
    /// The order's number (absent from events recorded before orders had numbers).
    #[serde(default)]
    pub number: i64,
    pub status: String,
    pub lines: Vec<ReceiptLine>,
    pub total_cents: i64,
    pub email: Option<String>,
    pub customer_name: Option<String>,
    #[serde(default)]
    pub shipping_address: Option<crate::address::ShippingAddress>,
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// One line of a receipt.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct ReceiptLine {
    pub sku: String,
    pub name: String,
    pub quantity: i32,
    pub unit_price_cents: i64,
}

impl Receipt {
    /// The order's number as people read it, `#1001` (as `orders::reference` words it;
    /// events read nothing of `orders`): for an event from before orders had numbers, the
    /// first 8 characters of its id.
    pub fn reference(&self) -> String {
        match self.number {
            0 => self.id.simple().to_string()[..8].to_uppercase(),
            n => format!("#{n}"),
        }
    }

    pub fn total(&self) -> String {
        format_cents(self.total_cents)
    }
}

impl ReceiptLine {
    pub fn unit_price(&self) -> String {
        format_cents(self.unit_price_cents)
    }

    pub fn line_total(&self) -> String {
        format_cents(self.unit_price_cents * i64::from(self.quantity))
    }
}

#[derive(Template)]
#[template(path = "mail/receipt.txt")]
struct ReceiptText<'a> {
    order: &'a Receipt,
    link: &'a str,
    shop: &'a str,
}

#[derive(Template)]
#[template(path = "mail/receipt.html")]
struct ReceiptHtml<'a> {
    order: &'a Receipt,
    link: &'a str,
    shop: &'a str,
}

/// Where receipts go.
pub enum Mailer {
    Smtp {
        transport: AsyncSmtpTransport<Tokio1Executor>,
        from: Mailbox,
        public_url: String,
    },
    Folder {
        dir: PathBuf,
        from: Mailbox,
        public_url: String,
    },
}

/// Why a receipt was not sent: worth retrying, or never going to work.
#[derive(Debug)]
pub enum MailError {
    Retry(String),
    Permanent(String),
}

impl Mailer {
    /// The mailer the settings ask for; `None` when mail is off (no SMTP URL, no folder).
    /// Links in receipts start with `public_url`.
    pub fn from_settings(s: &Settings, public_url: &str) -> anyhow::Result<Option<Self>> {
        let from: Mailbox = s
            .mail_from
            .parse()
            .map_err(|e| anyhow::anyhow!("STOCKADE_MAIL_FROM {:?}: {e}", s.mail_from))?;
        crate::install_tls_provider();
        let public_url = public_url.trim_end_matches('/').to_string();
        if let Some(url) = &s.smtp_url {
            let transport = AsyncSmtpTransport::<Tokio1Executor>::from_url(url)
                .map_err(|e| anyhow::anyhow!("STOCKADE_SMTP_URL cannot be used: {e}"))?
                .timeout(Some(s.webhook_timeout))
                .build();
            return Ok(Some(Self::Smtp {
                transport,
                from,
                public_url,
            }));
        }
        Ok(s.mail_dir.clone().map(|dir| Self::Folder {
            dir,
            from,
            public_url,
        }))
    }

    /// Whether receipts reach the shopper (SMTP), not just a folder.
    pub fn reaches_shoppers(&self) -> bool {
        matches!(self, Self::Smtp { .. })
    }

    /// Sends the receipt for `order` (from event `event_id`); what the server said.
    pub async fn send_receipt(&self, event_id: Uuid, order: &Receipt) -> Result<String, MailError> {
        let (from, public_url) = match self {
            Self::Smtp {
                from, public_url, ..
            }
            | Self::Folder {
                from, public_url, ..
            } => (from, public_url),
        };
        let message = receipt(from, public_url, event_id, order)?;
        match self {
            Self::Smtp { transport, .. } => match transport.send(message).await {
                Ok(response) => Ok(format!(
                    "{} {}",
                    response.code(),
                    response.message().collect::<Vec<_>>().join(" ")
                )),
                Err(e) if e.is_permanent() => Err(MailError::Permanent(e.to_string())),
                Err(e) => Err(MailError::Retry(e.to_string())),
            },
            Self::Folder { dir, .. } => {
                let path = write_eml(dir, event_id, &message.formatted())
                    .await
                    .map_err(|e| MailError::Retry(format!("writing to {}: {e}", dir.display())))?;
                Ok(format!("written to {}", path.display()))
            }
        }
    }
}

/// The receipt message: text and HTML alternatives, a Message-ID fixed by the event.
fn receipt(
    from: &Mailbox,
    public_url: &str,
    event_id: Uuid,
    order: &Receipt,
) -> Result<Message, MailError> {
    let email = order
        .email
        .as_deref()
        .ok_or_else(|| MailError::Permanent("the order has no email".into()))?;
    let to: Mailbox = match &order.customer_name {
        Some(name) => format!("{name} <{email}>").parse(),
        None => email.parse(),
    }
    .or_else(|_| email.parse())
    .map_err(|e| {
        MailError::Permanent(format!("{email:?} is not an address mail can go to: {e}"))
    })?;
    let link = format!("{public_url}/orders/{}", order.id);
    let shop = "Stockade";
    let text = ReceiptText {
        order,
        link: &link,
        shop,
    }
    .render()
    .map_err(|e| MailError::Permanent(e.to_string()))?;
    let html = ReceiptHtml {
        order,
        link: &link,
        shop,
    }
    .render()
    .map_err(|e| MailError::Permanent(e.to_string()))?;
    let domain = from.email.domain().to_string();
    Message::builder()
        .from(from.clone())
        .to(to)
        .subject(format!(
            "Your order {} ({})",
            order.reference(),
            order.total()
        ))
        .message_id(Some(format!("<{}@{domain}>", event_id.simple())))
        .multipart(MultiPart::alternative_plain_html(text, html))
        .map_err(|e| MailError::Permanent(e.to_string()))
}

/// Writes `bytes` as `<dir>/<event id>.eml`, whole or not at all (a temporary file
/// renamed), so a repeat replaces the same file.
async fn write_eml(dir: &Path, event_id: Uuid, bytes: &[u8]) -> std::io::Result<PathBuf> {
    tokio::fs::create_dir_all(dir).await?;
    let path = dir.join(format!("{event_id}.eml"));
    let partial = dir.join(format!(".{event_id}.eml.partial"));
    tokio::fs::write(&partial, bytes).await?;
    tokio::fs::rename(&partial, &path).await?;
    Ok(path)
}

/// A receipt in the folder, as the admin lists it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Written {
    pub file: String,
    pub to: String,
    pub subject: String,
    pub at: chrono::DateTime<chrono::Utc>,
}

/// The latest `n` receipts in `dir`, newest first (empty when there is no folder).
pub fn latest(dir: &Path, n: usize) -> Vec<Written> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<(std::time::SystemTime, PathBuf)> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "eml"))
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .collect();
    files.sort_by_key(|f| std::cmp::Reverse(f.0));
    files
        .into_iter()
        .take(n)
        .map(|(at, path)| {
            let head = std::fs::read_to_string(&path).unwrap_or_default();
            let header = |name: &str| {
                head.lines()
                    .take_while(|l| !l.is_empty())
                    .find_map(|l| l.strip_prefix(name))
                    .unwrap_or_default()
                    .trim()
                    .to_string()
            };
            Written {
                file: path
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into(),
                to: header("To:"),
                subject: header("Subject:"),
                at: at.into(),
            }
        })
        .collect()
}
