// Small progressive enhancements; every page works without this file.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  // Disable submit buttons once a form is sent, so a double click sends one request.
  // The server's idempotency key is what really prevents a double order.
  for (const form of document.querySelectorAll("form[data-once]")) {
    form.addEventListener("submit", () => {
      for (const button of form.querySelectorAll("button[type=submit]")) {
        button.disabled = true;
        button.dataset.label = button.textContent;
        button.textContent = button.dataset.busy || "Working…";
      }
    });
  }
});
