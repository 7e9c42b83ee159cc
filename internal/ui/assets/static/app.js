// pgcoord dashboard: confirm actions, and refresh the page's content every few seconds
// while the tab is visible. Plain JavaScript, no dependencies.
(function () {
  'use strict';

  // Drop ?msg= from the address so that a reload does not show an action's result again.
  var here = new URL(location.href);
  if (here.searchParams.has('msg')) {
    here.searchParams.delete('msg');
    history.replaceState(null, '', here);
  }

  // Actions ask first; the server refuses a POST whose confirmed field is not "yes".
  document.addEventListener('submit', function (e) {
    var form = e.target;
    if (!form.dataset.confirm) return;
    if (!window.confirm(form.dataset.confirm)) {
      e.preventDefault();
      return;
    }
    form.elements.confirmed.value = 'yes';
  });

  var main = document.getElementById('content');
  var every = main ? parseInt(main.dataset.refresh, 10) : 0;
  if (!every) return; // an error page: nothing to refresh
  var timer = null;
  var stale = document.getElementById('stale');
  var refreshes = 0;

  // editing reports whether the operator is filling in a form of the page: a field has
  // the focus, or holds a value other than the one the page was drawn with; or reads a
  // payload it opened (a refresh would close it).
  function editing() {
    if (main.querySelector('details[open]')) return true;
    var a = document.activeElement;
    if (a && main.contains(a) && (a.tagName === 'INPUT' || a.tagName === 'SELECT' || a.tagName === 'TEXTAREA')) return true;
    var fields = main.querySelectorAll('input:not([type=hidden])');
    for (var i = 0; i < fields.length; i++) {
      if (fields[i].value !== fields[i].defaultValue) return true;
    }
    return false;
  }

  function schedule() {
    if (timer === null && document.visibilityState === 'visible') timer = setTimeout(refresh, every);
  }

  function refresh() {
    timer = null;
    if (document.visibilityState !== 'visible') return;
    if (editing()) { schedule(); return; } // do not wipe what the operator is typing
    var url = new URL(location.href);
    url.searchParams.set('fragment', '1');
    fetch(url, { headers: { Accept: 'text/html' }, credentials: 'same-origin' })
      .then(function (r) {
        if (r.redirected) { location.reload(); return null; } // signed out: show the login form
        if (!r.ok) throw new Error('HTTP ' + r.status);
        return r.text();
      })
      .then(function (html) {
        if (html === null) return;
        if (editing()) return; // the operator began typing or opened a payload meanwhile: keep it
        main.innerHTML = html;
        refreshes++;
        document.body.dataset.refreshes = String(refreshes);
        if (stale) stale.hidden = true;
      })
      .catch(function () { if (stale) stale.hidden = false; })
      .then(schedule);
  }

  document.addEventListener('visibilitychange', function () {
    if (document.visibilityState === 'visible') {
      if (timer === null) refresh();
    } else if (timer !== null) {
      clearTimeout(timer);
      timer = null;
    }
  });
  schedule();
})();
