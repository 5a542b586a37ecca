// The theme's sidebar folds sub-pages under a <summary> that holds only an icon,
// so screen readers announce nothing. Name each one after the page it folds.
document.addEventListener("DOMContentLoaded", function () {
  var label = document.documentElement.lang.indexOf("zh") === 0 ? "展开或收起：" : "Show or hide: ";
  document.querySelectorAll("nav details > summary").forEach(function (summary) {
    if (summary.textContent.trim() || summary.hasAttribute("aria-label")) {
      return;
    }
    var item = summary.closest("li");
    var link = item && item.querySelector(":scope > a");
    summary.setAttribute("aria-label", label + (link ? link.textContent.trim() : ""));
  });
});
