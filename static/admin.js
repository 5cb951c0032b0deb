// The admin dashboard, live: polls its JSON every second and updates the numbers and
// lists in place (text only, never HTML, so product names cannot inject markup).
"use strict";
(() => {
  const root = document.getElementById("dashboard");
  if (!root) return;
  const status = document.getElementById("live-status");
  const cell = (text, cls, href) => {
    const td = document.createElement("td");
    if (cls) td.className = cls;
    if (href) {
      const a = document.createElement("a");
      a.href = href;
      a.textContent = text;
      td.appendChild(a);
    } else {
      td.textContent = text;
    }
    return td;
  };
  const rows = {
    low_stock: (r) => [cell(r.sku, "", `/admin/products/${encodeURIComponent(r.sku)}`), cell(r.name), cell(String(r.available), "num")],
    sold_out: (r) => [cell(r.sku, "", `/admin/products/${encodeURIComponent(r.sku)}`), cell(r.name), cell(String(r.reserved), "num")],
    recent_orders: (o) => [cell(o.reference, "", `/admin/orders/${o.id}`), cell(o.at), cell(o.status), cell(String(o.units), "num"), cell(o.total, "num")],
  };
  const refresh = async () => {
    try {
      const res = await fetch(root.dataset.source, { credentials: "same-origin", cache: "no-store" });
      if (!res.ok) throw new Error(String(res.status));
      const d = await res.json();
      for (const el of document.querySelectorAll("[data-live]")) {
        el.textContent = String(d[el.dataset.live]);
      }
      for (const [name, render] of Object.entries(rows)) {
        const body = document.querySelector(`[data-list="${name}"]`);
        if (!body) continue;
        body.replaceChildren(...d[name].map((item) => {
          const tr = document.createElement("tr");
          tr.append(...render(item));
          return tr;
        }));
      }
      const layer = document.getElementById("lease-layer");
      layer.textContent = d.lease_layer;
      layer.className = d.lease_layer === "up" ? "ok" : "bad";
      status.textContent = `live · updated ${new Date().toISOString().slice(11, 19)} UTC`;
    } catch (e) {
      status.textContent = "live updates paused (reconnecting)";
    }
  };
  setInterval(refresh, 1000);
})();
