  // What every console page shares, put into its script when it is
  // served: the token kept in the tab, the status line, table cells, and
  // signing in and out. MAIN, set by the page, is the id of the part it
  // shows once signed in.
  var KEY = "assay.console.token";
  var $ = function (id) { return document.getElementById(id); };
  function status(state, text) {
    $("status").dataset.state = state;
    $("status").textContent = text;
  }
  function when(t) { return t ? new Date(t).toLocaleString() : ""; }
  function cell(tr, text, field, num) {
    var td = document.createElement("td");
    td.textContent = text === undefined || text === null ? "" : String(text);
    if (field) { td.dataset.field = field; }
    if (num) { td.className = "num"; }
    tr.appendChild(td);
    return td;
  }
  function showLogin(message) {
    $("login").hidden = false;
    $(MAIN).hidden = true;
    $("signout").hidden = true;
    $("error").textContent = message || "";
    $("token").focus();
  }
  function showMain() {
    $("login").hidden = true;
    $(MAIN).hidden = false;
    $("signout").hidden = false;
  }
  // signInOut wires the sign-in form (the token kept, then load) and the
  // sign-out button (out, when set, first), and loads the page.
  function signInOut(load, out) {
    $("login-form").addEventListener("submit", function (ev) {
      ev.preventDefault();
      var token = $("token").value.trim();
      if (!token) { return; }
      sessionStorage.setItem(KEY, token);
      $("token").value = "";
      $("error").textContent = "";
      load();
    });
    $("signout").addEventListener("click", function () {
      sessionStorage.removeItem(KEY);
      if (out) { out(); }
      status("idle", "");
      showLogin("");
    });
    load();
  }
