// Starts Swagger UI on /docs (a file, not an inline script: the page's CSP allows 'self' only).
"use strict";
window.addEventListener("load", () => {
  window.ui = window.SwaggerUIBundle({
    url: "/openapi.json",
    dom_id: "#swagger-ui",
    deepLinking: true,
    presets: [window.SwaggerUIBundle.presets.apis],
    layout: "BaseLayout",
  });
});
