// Package console is an operator's console for idemq in the browser: an
// http.Handler a service mounts under a prefix of its own, beside its
// other admin pages, behind its own authentication.
//
//	h, err := console.New(console.Config{Store: store, Consumers: consumers})
//	mux.Handle("/idemq/", http.StripPrefix("/idemq", auth(h)))
//
// Its pages call the functions the idemq command calls (package admin):
//
//   - the overview: the dedup table's size on every view from bounded
//     queries only (admin.Store.Estimate: the database's statistics, or a
//     count that stops at admin.CountCap, labelled with how it is
//     obtained); the table's claims split between the consumers shown and
//     the others, and per consumer its claims (admin.Store.Stats, a full
//     count, taken at most once per Config.StatsEvery and shown with its
//     age), the dead letters waiting (a scan that stops at 1000), the
//     store's retention held against the broker's redelivery horizon
//     (admin.CheckHorizon, checked in the background and kept), and the
//     outbox's backlog; per consumer, its processed messages per minute
//     over the last hour (an inline SVG): with Consumer.Stats, sampled
//     from the running Consumer with its duplicates and totals, else the
//     claims the store recorded per minute (admin.Store.ClaimsPerMinute, a
//     bounded range read of the processed_at index, asked at most once
//     per Config.SampleEvery);
//   - a consumer's dead letters grouped by cause (admin.CauseGroup: ids,
//     numbers and quoted values masked), filtered by cause text, id and
//     age (admin.Selection, the filters of idemq dlq); one message's
//     detail, its body shown only on request and through
//     Config.RedactBody; redrive and purge of one message, a selection or
//     a whole group, each after a confirmation page that counts what the
//     action takes and, for a redrive, refuses messages parked longer ago
//     than the store keeps claims (admin.RedriveGuard), as idemq dlq
//     redrive does;
//   - the lookup of message ids (claimed or not, when, fingerprint,
//     lease), and forgetting one claim after its id is typed again;
//   - the outbox: pending rows and the oldest one's age, the parked rows,
//     redrive and purge of parked rows.
//
// The dedup store records claims but not duplicates (a duplicate is a
// claim that lost), so duplicates over time come from the running
// Consumer: mounted in the service that runs it, the console samples each
// Consumer.Stats (set it to the core.Consumer's Stats method) every
// Config.SampleEvery from New until Config.Context ends, keeps the last
// hour per minute in a bounded ring, and draws it on the overview. A
// consumer without Stats (every consumer of the idemq console command,
// which runs apart from them) has its processed messages drawn from the
// store: a processed message is a claim that won, recorded with its time.
// Its duplicates are on the Grafana dashboard (docs/dashboards/idemq.json).
//
// Reading never changes anything: every page is a GET, every action a POST
// that carries a token (an HMAC under a secret each handler draws at New)
// bound to the action and, where one is known, the user, and that comes
// from the console's own origin (Sec-Fetch-Site, Origin;
// net/http.CrossOriginProtection). A page of another origin can neither
// read a token (the console allows no other origin to read or frame it)
// nor post from its own origin. Where no user is known (no password, or a
// service's authentication that does not tell the console, see
// Config.User) any token of an action does that action, which whoever
// reaches the console could do anyway. With Config.ReadOnly every action
// is refused and no button is shown. Every action, and every message body
// shown, is logged to Config.Logger with who did it (Config.User), what
// and how many. Credentials in URLs are never shown.
//
// The pages are rendered on the server (html/template); their stylesheet
// and a few lines of script (select all) are embedded, so the console
// works offline and loads nothing from elsewhere.
package console
