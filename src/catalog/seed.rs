//! The demo catalogue: a dozen products a small desk-and-coffee shop might sell, with one
//! limited drop that sells out in seconds during a flash sale.

use sqlx::PgPool;

use super::Sku;
use crate::inventory;

/// `(sku, name, description, price in cents, units on hand)`.
pub const DEMO_CATALOGUE: &[(&str, &str, &str, i64, i32)] = &[
    (
        "KB-ALPINE-75",
        "Alpine 75 Keyboard",
        "A 75% aluminium keyboard with hot-swappable linear switches and a gasket mount that softens every keystroke.",
        18_900,
        40,
    ),
    (
        "KB-DROP-ORCA",
        "Orca Limited Edition Keyboard",
        "Numbered run of 25: anodised deep-sea blue case, brass plate, hand-lubed switches. Once they are gone, they are gone.",
        34_900,
        3,
    ),
    (
        "MS-DRIFT-WL",
        "Drift Wireless Mouse",
        "58 grams, three-mode wireless, a sensor that tracks on glass, and a battery that lasts a month.",
        7_900,
        120,
    ),
    (
        "DM-WALNUT-90",
        "Walnut Desk Mat",
        "90 × 40 cm of vegetable-tanned leather on a walnut-stained cork back.",
        5_400,
        65,
    ),
    (
        "LT-ARC-LAMP",
        "Arc Monitor Light Bar",
        "Asymmetric light that lands on the desk, not the screen; warm to daylight in 16 steps.",
        6_900,
        34,
    ),
    (
        "HP-STUDIO-01",
        "Studio One Headphones",
        "Open-back headphones with velour pads for long, quiet days of deep work.",
        14_900,
        18,
    ),
    (
        "CF-KETTLE-GN",
        "Gooseneck Pour-Over Kettle",
        "0.9 litres, set to the degree, holds temperature for an hour while you weigh the beans.",
        11_900,
        25,
    ),
    (
        "CF-GRINDER-M",
        "Burr Grinder Mk II",
        "Conical steel burrs, 40 click settings from espresso to cold brew.",
        16_500,
        12,
    ),
    (
        "CF-BEANS-ETH",
        "Ethiopia Guji Coffee, 250 g",
        "Washed heirloom beans with notes of bergamot, peach and black tea. Roasted weekly.",
        1_650,
        200,
    ),
    (
        "MG-STONE-350",
        "Stoneware Mug, 350 ml",
        "Thrown by hand in a speckled glaze; every one is a little different.",
        2_800,
        80,
    ),
    (
        "NB-DOT-A5",
        "Dot Grid Notebook A5",
        "192 numbered pages of 100 gsm paper that fountain pens do not bleed through.",
        2_200,
        150,
    ),
    (
        "CB-BRAID-2M",
        "Braided USB-C Cable, 2 m",
        "240 W, 40 Gbit/s, and a braid that survives the desk drawer.",
        2_400,
        4,
    ),
];

/// The demo's categories, by SKU.
const CATEGORIES: &[(&str, &str)] = &[
    ("KB-ALPINE-75", "Keyboards"),
    ("KB-DROP-ORCA", "Keyboards"),
    ("MS-DRIFT-WL", "Desk"),
    ("DM-WALNUT-90", "Desk"),
    ("LT-ARC-LAMP", "Desk"),
    ("HP-STUDIO-01", "Audio"),
    ("CF-KETTLE-GN", "Coffee"),
    ("CF-GRINDER-M", "Coffee"),
    ("CF-BEANS-ETH", "Coffee"),
    ("MG-STONE-350", "Coffee"),
    ("NB-DOT-A5", "Paper"),
    ("CB-BRAID-2M", "Desk"),
];

/// The demo's purchase limits: the limited drop is one per customer.
const LIMITS: &[(&str, i32)] = &[("KB-DROP-ORCA", 1)];

/// Inserts the demo catalogue; products that already exist are left alone.
/// Returns how many products were added.
pub async fn seed_demo(pool: &PgPool) -> anyhow::Result<usize> {
    let mut tx = pool.begin().await?;
    let mut added = 0;
    for &(sku, name, description, price_cents, on_hand) in DEMO_CATALOGUE {
        let sku = Sku::parse(sku)?;
        let inserted = sqlx::query(
            r#"insert into products (sku, name, description, price_cents, purchase_limit, category)
               values ($1, $2, $3, $4, $5, $6)
               on conflict (sku) do nothing"#,
        )
        .bind(sku.as_str())
        .bind(name)
        .bind(description)
        .bind(price_cents)
        .bind(
            LIMITS
                .iter()
                .find(|(s, _)| *s == sku.as_str())
                .map(|(_, n)| *n),
        )
        .bind(
            CATEGORIES
                .iter()
                .find(|(s, _)| *s == sku.as_str())
                .map(|(_, c)| *c),
        )
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if inserted == 1 {
            inventory::db::create_stock(&mut tx, &sku, on_hand, "seed").await?;
            added += 1;
        }
    }
    tx.commit().await?;
    Ok(added)
}
