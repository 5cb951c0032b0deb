//! The admin's ledger page: running totals counted back from the stock row agree with the
//! ledger's own running sum, on every page.

use crate::helpers::spawn_app;

/// The last cell of each row: the on-hand count after the movement.
fn running_column(html: &str) -> Vec<i64> {
    html.split("</td></tr>")
        .filter_map(|row| {
            row.rsplit_once(r#"<td class="num">"#)?
                .1
                .trim()
                .parse()
                .ok()
        })
        .collect()
}

#[tokio::test]
async fn every_ledger_page_shows_the_running_on_hand_the_ledger_sums_to() {
    let app = spawn_app().await;
    app.add_product("LEDGER-1", "Long Ledger", 900, 40).await;
    let sku = stockade::catalog::Sku::parse("LEDGER-1").unwrap();
    for i in 0..70 {
        let mut tx = app.db.begin().await.unwrap();
        stockade::inventory::db::restock(&mut tx, &sku, i % 7 + 1, "test", "test")
            .await
            .unwrap();
        tx.commit().await.unwrap();
        if i % 5 == 0 {
            let res = app
                .post_order(&format!("ledger-{i}"), &[("LEDGER-1", 2)])
                .await;
            assert_eq!(res.status(), 201);
        }
    }
    let expected: Vec<i64> = sqlx::query_scalar!(
        r#"select (sum(delta) over (order by id))::bigint as "running!"
             from stock_movements where sku = 'LEDGER-1' order by id desc"#
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert!(
        expected.len() > 60,
        "more than one page: {}",
        expected.len()
    );
    app.login_admin().await;
    let mut shown = Vec::new();
    for page in 1..=3 {
        let (status, html) = app
            .get_text(&format!("/admin/products/LEDGER-1/ledger?page={page}"))
            .await;
        assert_eq!(status, 200);
        shown.extend(running_column(&html));
    }
    assert_eq!(shown, expected, "page after page, newest first");
}

#[tokio::test]
async fn a_ledger_longer_than_is_counted_says_so_and_still_links_older_pages() {
    let app = spawn_app().await;
    app.add_product("LEDGER-BIG", "Very Long Ledger", 900, 0)
        .await;
    let rows = stockade::inventory::ledger::COUNTED + 50;
    sqlx::query!(
        "insert into stock_movements (sku, delta, reason, actor)
         select 'LEDGER-BIG', 1, 'restock', 'test' from generate_series(1, $1::bigint)",
        rows
    )
    .execute(&app.db)
    .await
    .unwrap();
    sqlx::query!(
        "update stock set on_hand = on_hand + $1::bigint::int where sku = 'LEDGER-BIG'",
        rows
    )
    .execute(&app.db)
    .await
    .unwrap();
    app.login_admin().await;
    let (status, html) = app.get_text("/admin/products/LEDGER-BIG/ledger").await;
    assert_eq!(status, 200);
    assert!(html.contains("Page 1 of 2000+"), "{html}");
    assert_eq!(running_column(&html)[0], rows, "the newest row: every unit");
    let (status, last_counted) = app
        .get_text("/admin/products/LEDGER-BIG/ledger?page=2000")
        .await;
    assert_eq!(status, 200, "{last_counted}");
    assert!(
        last_counted.contains("ledger?page=2001\">Older"),
        "past what was counted, older pages are still linked: {last_counted}"
    );
    let (status, beyond) = app
        .get_text("/admin/products/LEDGER-BIG/ledger?page=2001")
        .await;
    assert_eq!(status, 200, "{beyond}");
    assert_eq!(
        running_column(&beyond).len(),
        50,
        "the 50 rows past what was counted"
    );
}
