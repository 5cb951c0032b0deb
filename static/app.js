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
