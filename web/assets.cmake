# The files of gacd's page, compiled into gacd (web/embed.cmake writes them
# into a C++ source; server/CMakeLists.txt builds it into gac::server).
# One entry per file: URL path, content type (UTF-8 text), path relative to web/.
# The charting library comes from node_modules (npm ci, pinned by
# package-lock.json; scripts/setup.sh runs it).
set(GAC_WEB_ASSETS
  "/index.html|text/html|index.html"
  "/app.js|text/javascript|app.js"
  "/style.css|text/css|style.css"
  "/vendor/uPlot.iife.min.js|text/javascript|node_modules/uplot/dist/uPlot.iife.min.js"
  "/vendor/uPlot.min.css|text/css|node_modules/uplot/dist/uPlot.min.css"
  "/vendor/uPlot.LICENSE.txt|text/plain|node_modules/uplot/LICENSE")
