// Injected by test_report_html.cpp at the very start of the report's <head>, before anything of
// the page: records every uncaught script error, unhandled promise rejection, console.error call
// and failed resource load, for report_html_check.js to report.
(function () {
  var errors = (window.dprunTestErrors = []);
  function text(v) {
    if (v instanceof Error) return v.name + ": " + v.message;
    try {
      return typeof v === "string" ? v : JSON.stringify(v);
    } catch (e) {
      return String(v);
    }
  }
  window.onerror = function (message, source, line, column, error) {
    errors.push("uncaught " + text(error || message) + " at " + source + ":" + line + ":" + column);
  };
  // Capturing, so load errors of <img>, <link>, <script src> (which do not bubble) arrive too;
  // script errors are window.onerror's.
  window.addEventListener(
    "error",
    function (e) {
      var t = e.target;
      if (t && t !== window && t.tagName)
        errors.push("failed to load <" + t.tagName.toLowerCase() + "> " + (t.src || t.href || ""));
    },
    true
  );
  window.addEventListener("unhandledrejection", function (e) {
    errors.push("unhandled promise rejection: " + text(e.reason));
  });
  var consoleError = console.error;
  console.error = function () {
    errors.push("console.error: " + Array.prototype.map.call(arguments, text).join(" "));
    return consoleError.apply(console, arguments);
  };
})();
