// Small progressive enhancements; every page works without this file.
"use strict";

// Disable submit buttons once a form is sent, so a double click sends one request.
// The server's idempotency key is what really prevents a double order.
function guardForms() {
  for (const form of document.querySelectorAll("form[data-once]")) {
    form.addEventListener("submit", () => {
      for (const button of form.querySelectorAll("button[type=submit]")) {
        button.disabled = true;
        button.dataset.label = button.textContent;
        button.textContent = button.dataset.busy || "Working…";
      }
    });
  }
}

// A page restored by the back button keeps its disabled buttons; enable them again.
window.addEventListener("pageshow", (event) => {
  if (!event.persisted) return;
  for (const button of document.querySelectorAll("form[data-once] button[disabled]")) {
    button.disabled = false;
    if (button.dataset.label) button.textContent = button.dataset.label;
  }
});

document.addEventListener("DOMContentLoaded", guardForms);

// The checkout countdown: "Held for you for 9:41", counting down to the hold's expiry.
// The ticking figure is hidden from screen readers; they read the whole minutes left, and
// the status region says so once a minute, and once when the hold runs out.
document.addEventListener("DOMContentLoaded", () => {
  const countdown = document.getElementById("countdown");
  if (!countdown) return;
  // The seconds left when the page was made, counted from now, unless the page is older
  // than that (a refused form's answer, reloaded minutes later): then the hold's own
  // deadline, which never shows more time than is left.
  const deadline = Math.min(
    Date.now() + Number(countdown.dataset.seconds) * 1000,
    Number(countdown.dataset.until),
  );
  const label = document.getElementById("time-left");
  const spoken = document.getElementById("minutes-left");
  const status = document.getElementById("countdown-status");
  const words = (minutes) => (minutes === 1 ? "1 minute" : `${minutes} minutes`);
  let minutes = Math.ceil((deadline - Date.now()) / 60000);
  const tick = () => {
    const left = Math.max(0, Math.round((deadline - Date.now()) / 1000));
    label.textContent = `${Math.floor(left / 60)}:${String(left % 60).padStart(2, "0")}`;
    const now = Math.ceil(left / 60);
    if (now < minutes && left > 0) {
      minutes = now;
      spoken.textContent = words(now);
      status.textContent = `${words(now)} left to place your order.`;
    }
    if (left === 0) {
      countdown.hidden = true;
      const expired = document.getElementById("countdown-expired");
      expired.hidden = false;
      status.textContent = expired.textContent;
      clearInterval(timer);
    }
  };
  const timer = setInterval(tick, 1000);
  tick();
});

// A drop's countdown on its product page: "On sale at 18:00 UTC · in 1:02:03". The time
// is in the page; the figure left beside it is for sighted shoppers only (a screen reader
// reads the time, not a number changing every second). At the opening the page loads
// again, with the queue or the cart as it then stands.
document.addEventListener("DOMContentLoaded", () => {
  const countdown = document.getElementById("drop-countdown");
  if (!countdown) return;
  const opens = Date.now() + Number(countdown.dataset.seconds) * 1000;
  const shown = document.getElementById("drop-countdown-left");
  const left = shown.querySelector(".left");
  const two = (n) => String(n).padStart(2, "0");
  const tick = () => {
    const s = Math.max(0, Math.round((opens - Date.now()) / 1000));
    const days = Math.floor(s / 86400);
    const [h, m, sec] = [Math.floor((s % 86400) / 3600), Math.floor((s % 3600) / 60), s % 60];
    left.textContent = days > 0
      ? `${days} day${days === 1 ? "" : "s"} ${h}:${two(m)}:${two(sec)}`
      : `${h}:${two(m)}:${two(sec)}`;
    shown.hidden = false;
    if (s === 0) {
      clearInterval(timer);
      location.reload();
    }
  };
  const timer = setInterval(tick, 1000);
  tick();
});

// Parts of a page that keep themselves current (a drop's queue, the admin's live view of
// a drop): an element with an id and `data-refresh="N"` is fetched again every N seconds
// (the server's figure, which each fetch may change; 0 stops) and its content swapped in
// place. The queue is a polite live region, so a screen reader reads out the new place.
// Without this file such a page reloads itself (a <noscript> refresh).
document.addEventListener("DOMContentLoaded", () => {
  for (const part of document.querySelectorAll("[data-refresh][id]")) {
    const later = (seconds) => {
      if (seconds > 0) setTimeout(update, seconds * 1000);
    };
    const update = async () => {
      try {
        const res = await fetch(location.href, { credentials: "same-origin" });
        const page = new DOMParser().parseFromString(await res.text(), "text/html");
        const fresh = page.getElementById(part.id);
        if (!fresh) return later(5);
        part.replaceChildren(...[...fresh.childNodes].map((n) => document.importNode(n, true)));
        part.dataset.refresh = fresh.dataset.refresh;
        guardForms();
        later(Number(fresh.dataset.refresh));
      } catch {
        later(5);
      }
    };
    later(Number(part.dataset.refresh));
  }
});
