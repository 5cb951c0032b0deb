//! Purchase limits: how a shopper is named for counting, how many units of a product the
//! names have bought or hold, and the refusal a shopper reads. Every path that turns stock
//! into a sale — an order, a hold, a batch, a hold's confirmation (live or expired) —
//! counts here, after its transaction locked the product's stock row, which orders every
//! sale of that SKU: so the count sees every order or hold committed before it.

use sqlx::PgConnection;
use uuid::Uuid;

use super::db::{OrderProduct, bought_by};

/// The identity under which an email is counted: the mailbox its mail reaches, so one
/// customer cannot pass a limit by spelling their address another way. Lower-cased
/// (`Ada@X` is `ada@x`); a `+tag` after the local part is dropped (`ada+1@x` is `ada@x`:
/// the providers that deliver it at all deliver it to `ada@x`); and at Gmail, which ignores
/// dots and answers to `googlemail.com` too, dots go and the domain is `gmail.com`
/// (`a.d.a@googlemail.com` is `ada@gmail.com`).
///
/// Always on, with no setting: a shop that wanted `ada+1@x` counted apart from `ada@x`
/// would be asking for its limit to be passed. Only the identity is folded; the order keeps
/// the address as typed, for its receipt. A local part that is nothing but a tag (`+x@y`)
/// is kept whole, as there is nothing else to name it by.
pub fn email_identity(email: &str) -> String {
    let email = email.trim().to_lowercase();
    let Some((local, domain)) = email.rsplit_once('@') else {
        return format!("email:{email}");
    };
    let local = match local.split_once('+') {
        Some((mailbox, _tag)) if !mailbox.is_empty() => mailbox,
        _ => local,
    };
    match domain {
        "gmail.com" | "googlemail.com" => match local.replace('.', "") {
            dotless if dotless.is_empty() => format!("email:{local}@gmail.com"),
            dotless => format!("email:{dotless}@gmail.com"),
        },
        _ => format!("email:{local}@{domain}"),
    }
}

/// `identities` with `email`'s identity added when given and not already there.
pub fn with_email(identities: &[String], email: Option<&str>) -> Vec<String> {
    let mut all = identities.to_vec();
    if let Some(email) = email {
        let id = email_identity(email);
        if !all.contains(&id) {
            all.push(id);
        }
    }
    all
}

/// "Only N per customer" in words a shopper understands.
pub fn refusal(name: &str, limit: i32, asked: i32, bought: i64) -> String {
    if bought == 0 {
        format!("{name} is limited to {limit} per customer; you asked for {asked}.")
    } else {
        format!(
            "{name} is limited to {limit} per customer, and you already have {bought} \
             (ordered, or held in a checkout)."
        )
    }
}

/// Why `lines` (`(sku, quantity)`) may not go to the shopper named by `identities`: the
/// first line that would take them past its product's purchase limit, counting what they
/// bought or hold already — except hold `except`, the one being confirmed, whose units
/// are the ones asked for. `None`: they may. `products` are the lines' products
/// ([`super::db::products_for`]); a line without one has no limit. Run under the SKUs'
/// stock row locks.
pub async fn over_limit(
    conn: &mut PgConnection,
    lines: &[(&str, i32)],
    identities: &[String],
    products: &[OrderProduct],
    except: Option<Uuid>,
) -> sqlx::Result<Option<String>> {
    let limited: Vec<(&OrderProduct, i32, i32)> = lines
        .iter()
        .filter_map(|(sku, asked)| {
            let product = products.iter().find(|p| p.sku == *sku)?;
            Some((product, product.purchase_limit?, *asked))
        })
        .collect();
    if limited.is_empty() {
        return Ok(None);
    }
    let asks: Vec<(&str, &[String])> = limited
        .iter()
        .map(|(p, ..)| (p.sku.as_str(), identities))
        .collect();
    let bought = bought_by(conn, &asks, except).await?;
    Ok(limited
        .iter()
        .zip(bought)
        .find(|((_, limit, asked), bought)| bought + i64::from(*asked) > i64::from(*limit))
        .map(|((p, limit, asked), bought)| refusal(&p.name, *limit, *asked, bought)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_email_counts_once_whatever_its_case() {
        let ids = vec!["addr:203.0.113.7".to_string(), email_identity("Ada@X.org")];
        assert_eq!(with_email(&ids, Some(" ada@x.ORG ")), ids);
        let more = with_email(&ids, Some("bob@x.org"));
        assert_eq!(more.last().unwrap(), "email:bob@x.org");
        assert_eq!(with_email(&ids, None), ids);
    }

    #[test]
    fn an_email_counts_as_the_mailbox_it_reaches() {
        let alice = "email:alice@x.org";
        assert_eq!(email_identity("alice@x.org"), alice);
        assert_eq!(email_identity("Alice+1@X.org"), alice);
        assert_eq!(email_identity("alice+shop+2@x.org"), alice);
        // Dots matter elsewhere: only Gmail ignores them.
        assert_eq!(email_identity("a.l.i.c.e@x.org"), "email:a.l.i.c.e@x.org");
        let gmail = "email:alice@gmail.com";
        for same in [
            "alice@gmail.com",
            "a.l.i.c.e@gmail.com",
            "A.Lice+x@GMAIL.com",
            "a.l.i.c.e+x@googlemail.com",
            " alice@googlemail.com ",
        ] {
            assert_eq!(email_identity(same), gmail, "{same:?}");
        }
        // Nothing but a tag, or nothing but dots: kept, so the identity still names someone.
        assert_eq!(email_identity("+x@y.org"), "email:+x@y.org");
        assert_eq!(email_identity("..@gmail.com"), "email:..@gmail.com");
        // Another provider's domain that merely contains "gmail" is not Gmail.
        assert_eq!(email_identity("a.b@notgmail.com"), "email:a.b@notgmail.com");
        let ids = vec![email_identity("alice@gmail.com")];
        assert_eq!(with_email(&ids, Some("a.l.i.c.e+x@googlemail.com")), ids);
    }
}
