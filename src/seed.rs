//! The demo shop: a dozen products a small desk-and-coffee shop might sell, with one
//! limited drop that sells out in seconds during a flash sale. Each product comes with a
//! small picture of its own, drawn by a test in this module and committed, and its
//! opening stock. It sits above [`crate::catalog`] (the products and pictures) and
//! [`crate::inventory`] (the stock rows and their first ledger entries), which know
//! nothing of it.

use sqlx::PgPool;

use crate::catalog::{self, Sku, images};
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
        let product = catalog::db::NewProduct {
            sku: &sku,
            name,
            description,
            price_cents,
            purchase_limit: LIMITS
                .iter()
                .find(|(s, _)| *s == sku.as_str())
                .map(|(_, n)| *n),
            category: CATEGORIES
                .iter()
                .find(|(s, _)| *s == sku.as_str())
                .map(|(_, c)| *c),
        };
        if catalog::db::insert_product_if_new(&mut *tx, &product).await? {
            inventory::db::create_stock(&mut tx, &sku, on_hand, "seed").await?;
            added += 1;
        }
    }
    seed_pictures(&mut tx).await?;
    tx.commit().await?;
    Ok(added)
}

/// The demo pictures, drawn by [`tests::draw_the_demo_pictures`] and committed under
/// `static/demo/`: `(sku, picture)`, already re-encoded as an upload would be. They are
/// thumbnail-sized, so each is its own thumbnail.
const PICTURES: &[(&str, &[u8])] = &[
    (
        "KB-ALPINE-75",
        include_bytes!("../static/demo/KB-ALPINE-75.jpg"),
    ),
    (
        "KB-DROP-ORCA",
        include_bytes!("../static/demo/KB-DROP-ORCA.jpg"),
    ),
    (
        "MS-DRIFT-WL",
        include_bytes!("../static/demo/MS-DRIFT-WL.jpg"),
    ),
    (
        "DM-WALNUT-90",
        include_bytes!("../static/demo/DM-WALNUT-90.jpg"),
    ),
    (
        "LT-ARC-LAMP",
        include_bytes!("../static/demo/LT-ARC-LAMP.jpg"),
    ),
    (
        "HP-STUDIO-01",
        include_bytes!("../static/demo/HP-STUDIO-01.jpg"),
    ),
    (
        "CF-KETTLE-GN",
        include_bytes!("../static/demo/CF-KETTLE-GN.jpg"),
    ),
    (
        "CF-GRINDER-M",
        include_bytes!("../static/demo/CF-GRINDER-M.jpg"),
    ),
    (
        "CF-BEANS-ETH",
        include_bytes!("../static/demo/CF-BEANS-ETH.jpg"),
    ),
    (
        "MG-STONE-350",
        include_bytes!("../static/demo/MG-STONE-350.jpg"),
    ),
    ("NB-DOT-A5", include_bytes!("../static/demo/NB-DOT-A5.jpg")),
    (
        "CB-BRAID-2M",
        include_bytes!("../static/demo/CB-BRAID-2M.jpg"),
    ),
];

/// Stores the demo pictures of the products that have none.
async fn seed_pictures(tx: &mut sqlx::Transaction<'_, sqlx::Postgres>) -> anyhow::Result<()> {
    for &(sku, image) in PICTURES {
        let sku = Sku::parse(sku)?;
        let picture =
            images::Processed::stored(image.to_vec(), image.to_vec(), DEMO_SIDE, DEMO_SIDE);
        if !catalog::db::has_picture(&mut **tx, &sku).await? {
            images::save(&mut **tx, &sku, &picture, "seed").await?;
        }
    }
    Ok(())
}

/// The demo pictures' width and height: a thumbnail's.
const DEMO_SIDE: u32 = images::THUMB_SIDE;

#[cfg(test)]
mod tests {
    use super::*;
    use image::{Rgb, RgbImage};

    /// A shape drawn in one colour: whether a point (0–1 on both axes) is inside.
    enum Shape {
        Rect(f32, f32, f32, f32, f32),
        Circle(f32, f32, f32),
        Ring(f32, f32, f32, f32),
        Ellipse(f32, f32, f32, f32),
        Dots(f32, f32, f32, f32, f32),
        Wave(f32, f32, f32),
    }

    impl Shape {
        fn covers(&self, x: f32, y: f32) -> bool {
            let d = |cx: f32, cy: f32| ((x - cx).powi(2) + (y - cy).powi(2)).sqrt();
            match *self {
                Shape::Rect(x0, y0, x1, y1, r) => {
                    let dx = (x0 + r - x).max(x - (x1 - r)).max(0.0);
                    let dy = (y0 + r - y).max(y - (y1 - r)).max(0.0);
                    x >= x0 && x <= x1 && y >= y0 && y <= y1 && dx * dx + dy * dy <= r * r
                }
                Shape::Circle(cx, cy, r) => d(cx, cy) <= r,
                Shape::Ring(cx, cy, r0, r1) => (r0..=r1).contains(&d(cx, cy)),
                Shape::Ellipse(cx, cy, rx, ry) => {
                    ((x - cx) / rx).powi(2) + ((y - cy) / ry).powi(2) <= 1.0
                }
                Shape::Dots(x0, y0, x1, y1, step) => {
                    x >= x0 && x <= x1 && y >= y0 && y <= y1 && {
                        let (fx, fy) = (((x - x0) / step).fract(), ((y - y0) / step).fract());
                        (fx - 0.5).powi(2) + (fy - 0.5).powi(2) < 0.04
                    }
                }
                Shape::Wave(y0, amp, width) => {
                    (x > 0.1 && x < 0.9) && (y - (y0 + amp * (x * 18.0).sin())).abs() < width
                }
            }
        }
    }

    /// `(background, [(colour, shape)])` per demo product, in catalogue order.
    fn art(sku: &str) -> ([u8; 3], Vec<([u8; 3], Shape)>) {
        use Shape::*;
        let ink = [38, 60, 54];
        let keys = |colour: [u8; 3], case: [u8; 3]| {
            let mut shapes = vec![(case, Rect(0.1, 0.3, 0.9, 0.72, 0.05))];
            for row in 0..4 {
                for col in 0..8 {
                    let (x, y) = (0.14 + col as f32 * 0.092, 0.34 + row as f32 * 0.092);
                    shapes.push((colour, Rect(x, y, x + 0.075, y + 0.075, 0.015)));
                }
            }
            shapes
        };
        match sku {
            "KB-ALPINE-75" => ([231, 236, 232], keys([246, 244, 238], [150, 158, 160])),
            "KB-DROP-ORCA" => ([214, 228, 244], keys([232, 196, 104], [26, 58, 110])),
            "MS-DRIFT-WL" => (
                [244, 232, 236],
                vec![
                    ([60, 62, 70], Ellipse(0.5, 0.52, 0.2, 0.3)),
                    ([200, 202, 210], Rect(0.49, 0.25, 0.51, 0.42, 0.0)),
                ],
            ),
            "DM-WALNUT-90" => (
                [236, 230, 218],
                vec![
                    ([112, 72, 44], Rect(0.08, 0.32, 0.92, 0.7, 0.04)),
                    ([150, 104, 68], Rect(0.1, 0.34, 0.9, 0.68, 0.03)),
                ],
            ),
            "LT-ARC-LAMP" => (
                [34, 40, 52],
                vec![
                    ([250, 214, 120], Ellipse(0.5, 0.62, 0.4, 0.2)),
                    ([34, 40, 52], Rect(0.0, 0.3, 1.0, 0.62, 0.0)),
                    ([200, 204, 210], Rect(0.15, 0.24, 0.85, 0.3, 0.02)),
                ],
            ),
            "HP-STUDIO-01" => (
                [238, 226, 246],
                vec![
                    (ink, Ring(0.5, 0.52, 0.26, 0.31)),
                    ([238, 226, 246], Rect(0.0, 0.55, 1.0, 1.0, 0.0)),
                    ([92, 60, 120], Ellipse(0.22, 0.6, 0.08, 0.14)),
                    ([92, 60, 120], Ellipse(0.78, 0.6, 0.08, 0.14)),
                ],
            ),
            "CF-KETTLE-GN" => (
                [226, 240, 236],
                vec![
                    ([40, 44, 48], Ellipse(0.5, 0.6, 0.24, 0.2)),
                    ([40, 44, 48], Rect(0.67, 0.35, 0.7, 0.62, 0.0)),
                    ([40, 44, 48], Rect(0.67, 0.33, 0.86, 0.36, 0.0)),
                    ([120, 124, 128], Rect(0.44, 0.36, 0.56, 0.42, 0.02)),
                ],
            ),
            "CF-GRINDER-M" => (
                [246, 236, 222],
                vec![
                    ([160, 164, 170], Rect(0.36, 0.3, 0.64, 0.8, 0.04)),
                    ([90, 60, 40], Rect(0.4, 0.5, 0.6, 0.76, 0.02)),
                    (ink, Rect(0.48, 0.18, 0.52, 0.3, 0.0)),
                    (ink, Rect(0.48, 0.18, 0.72, 0.21, 0.0)),
                    ([120, 80, 50], Circle(0.72, 0.2, 0.04)),
                ],
            ),
            "CF-BEANS-ETH" => (
                [250, 240, 226],
                vec![
                    ([110, 66, 38], Ellipse(0.38, 0.45, 0.12, 0.17)),
                    ([96, 56, 32], Ellipse(0.62, 0.55, 0.12, 0.17)),
                    ([250, 240, 226], Rect(0.375, 0.3, 0.385, 0.6, 0.0)),
                    ([250, 240, 226], Rect(0.615, 0.4, 0.625, 0.7, 0.0)),
                ],
            ),
            "MG-STONE-350" => (
                [230, 238, 242],
                vec![
                    ([120, 140, 150], Ring(0.66, 0.52, 0.08, 0.13)),
                    ([214, 206, 190], Rect(0.3, 0.3, 0.66, 0.78, 0.05)),
                    ([170, 160, 144], Dots(0.32, 0.32, 0.64, 0.76, 0.05)),
                ],
            ),
            "NB-DOT-A5" => (
                [240, 244, 230],
                vec![
                    ([46, 84, 72], Rect(0.26, 0.16, 0.74, 0.84, 0.03)),
                    ([250, 248, 240], Rect(0.3, 0.2, 0.74, 0.8, 0.0)),
                    ([150, 160, 150], Dots(0.32, 0.22, 0.72, 0.78, 0.04)),
                ],
            ),
            "CB-BRAID-2M" => (
                [244, 236, 246],
                vec![
                    ([200, 70, 90], Wave(0.5, 0.12, 0.035)),
                    ([60, 62, 70], Rect(0.04, 0.44, 0.14, 0.56, 0.02)),
                    ([60, 62, 70], Rect(0.86, 0.44, 0.96, 0.56, 0.02)),
                ],
            ),
            other => panic!("no picture drawn for {other}"),
        }
    }

    /// Draws every demo product's picture, runs it through the upload path, and writes
    /// the results to `static/demo/`. Run it when the demo catalogue changes:
    /// `cargo test --lib -- --ignored draw_the_demo_pictures`.
    #[test]
    #[ignore = "writes static/demo/"]
    fn draw_the_demo_pictures() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("static/demo");
        std::fs::create_dir_all(&dir).unwrap();
        for (sku, ..) in DEMO_CATALOGUE {
            let (background, shapes) = art(sku);
            let side = DEMO_SIDE as f32;
            let picture = RgbImage::from_fn(DEMO_SIDE, DEMO_SIDE, |x, y| {
                let (x, y) = (x as f32 / side, y as f32 / side);
                let colour = shapes
                    .iter()
                    .rev()
                    .find(|(_, s)| s.covers(x, y))
                    .map_or(background, |(c, _)| *c);
                Rgb(colour)
            });
            let mut png = Vec::new();
            picture
                .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
                .unwrap();
            let done = images::process(&png).unwrap();
            assert_eq!(done.image, done.thumb, "thumbnail-sized");
            std::fs::write(dir.join(format!("{sku}.jpg")), &done.image).unwrap();
        }
    }

    #[test]
    fn every_demo_product_has_its_own_picture() {
        let mut seen = std::collections::HashSet::new();
        for (sku, ..) in DEMO_CATALOGUE {
            let (_, image) = PICTURES
                .iter()
                .find(|(s, ..)| s == sku)
                .unwrap_or_else(|| panic!("{sku} has no picture"));
            let decoded = image::load_from_memory(image).unwrap();
            assert_eq!((decoded.width(), decoded.height()), (DEMO_SIDE, DEMO_SIDE));
            assert!(image.len() < 20_000, "{sku}: {} bytes", image.len());
            assert!(seen.insert(image.to_vec()), "{sku} shares a picture");
        }
    }
}
