// Paying at checkout (when the shop takes payments): the card is tokenized in the
// browser by Stripe.js (the card number never reaches the shop), the shop's server sets
// it on the hold's payment and confirms it, 3-D Secure is completed in the browser when
// the bank asks, and only then is the order form sent. Pressing the button again while
// this runs does nothing; the server keeps one charge per checkout however often it is
// asked.
"use strict";

document.addEventListener("DOMContentLoaded", () => {
  const box = document.getElementById("payment");
  if (!box) return;
  const form = box.closest("form");
  const button = form.querySelector("button[type=submit]");
  const errors = document.getElementById("card-errors");
  if (typeof window.Stripe !== "function") {
    errors.textContent = "The card form could not be loaded. Please reload the page.";
    button.disabled = true;
    return;
  }
  const stripe = window.Stripe(box.dataset.publishableKey);
  const card = stripe.elements().create("card");
  card.mount("#card-element");

  let paid = false;
  let busy = false;

  const pause = (ms) => new Promise((done) => setTimeout(done, ms));

  async function pay(method) {
    const body = new URLSearchParams({ csrf: form.elements.csrf.value });
    if (method) body.set("payment_method", method);
    let res;
    // 409 with Retry-After: the payment is being finished by the shop meanwhile (its
    // provider's news of an earlier card); asked again shortly, a few times.
    for (let tries = 0; tries < 5; tries++) {
      res = await fetch(box.dataset.payUrl, {
        method: "POST",
        body,
        headers: { Accept: "application/json" },
      });
      if (res.status !== 409 || !res.headers.has("Retry-After")) break;
      await pause(1000);
    }
    const answer = await res.json().catch(() => ({}));
    if (!res.ok) {
      throw new Error(answer.detail || "The payment did not go through. Please try again.");
    }
    return answer;
  }

  // Runs before the form's own once-only guard (capture), and sends the form itself
  // once the payment is authorized.
  form.addEventListener(
    "submit",
    async (event) => {
      if (paid) return;
      event.preventDefault();
      event.stopImmediatePropagation();
      if (busy || !form.reportValidity()) return;
      busy = true;
      button.disabled = true;
      errors.textContent = "";
      try {
        const { token, error } = await stripe.createToken(card);
        if (error) throw new Error(error.message || "Please check the card's details.");
        let answer = await pay(token.card.id);
        if (answer.status === "requires_action") {
          const result = await stripe.confirmCardPayment(answer.client_secret);
          if (result.error) {
            throw new Error(result.error.message || "Your bank did not confirm the payment.");
          }
          answer = { status: "requires_capture" };
        }
        if (answer.status !== "requires_capture" && answer.status !== "succeeded") {
          throw new Error("The card was not accepted. Please try another card.");
        }
        paid = true;
        form.requestSubmit();
      } catch (e) {
        errors.textContent = e.message;
        button.disabled = false;
        busy = false;
      }
    },
    true,
  );
});
