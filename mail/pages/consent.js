// The only script of the confirm and decline pages (docs/api-contract.md §12), served from
// the service under Content-Security-Policy script-src 'self'. It submits nothing by itself:
// when a person activates the button (a trusted pointer or keyboard event), it copies the
// button's nonce into the form's intent field and lets the click submit the form. A click
// made by another script (event.isTrusted false) is cancelled; a form submitted as it is
// carries no intent and changes nothing.
(function () {
  "use strict";
  var form = document.getElementById("consent");
  if (!form) {
    return;
  }
  var button = form.querySelector("button[data-nonce]");
  var intent = form.querySelector("input[name=intent]");
  if (!button || !intent) {
    return;
  }
  button.addEventListener("click", function (event) {
    if (!event.isTrusted) {
      event.preventDefault();
      return;
    }
    intent.value = button.getAttribute("data-nonce");
  });
})();
