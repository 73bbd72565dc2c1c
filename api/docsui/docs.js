// Starts Swagger UI (swagger-ui-bundle.js, loaded before this file) on the OpenAPI document
// named by the data-url of #swagger-ui. Served by api/docs.go; no other origin is contacted.
(function () {
  var el = document.getElementById("swagger-ui");
  window.ui = SwaggerUIBundle({
    url: el.dataset.url,
    domNode: el,
    deepLinking: true,
    displayOperationId: true,
    // The default sends the document to validator.swagger.io; nothing leaves this origin.
    validatorUrl: null,
  });
})();
