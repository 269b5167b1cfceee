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
//     obtained); per consumer, the claims of the dedup table
//     (admin.Store.Stats, a full count, taken at most once per
//     Config.StatsEvery and shown with its age),
//     the dead letters waiting (a scan that stops at 1000), the store's
//     retention held against the broker's redelivery horizon
//     (admin.CheckHorizon, checked in the background and kept), and the
//     outbox's backlog; per consumer with Consumer.Stats, its processed
//     messages and duplicates per minute over the last hour (an inline
//     SVG) and its totals;
//   - a consumer's dead letters grouped by cause, filtered by cause text,
//     id and age; one message's detail, its body shown only on request
//     and through Config.RedactBody; redrive and purge of one message, a
//     selection or a whole group, each after a confirmation page that
//     counts what the action takes and, for a redrive, refuses messages
//     parked longer ago than the store keeps claims, as idemq dlq redrive
//     does;
//   - the lookup of message ids (claimed or not, when, fingerprint,
//     lease), and forgetting one claim after its id is typed again;
//   - the outbox: pending rows and the oldest one's age, the parked rows,
//     redrive and purge of parked rows.
//
// The dedup store records claims but not duplicates (a duplicate is a
// claim that lost), so the processed messages and duplicates over time
// come from the running Consumer: mounted in the service that runs it,
// the console samples each Consumer.Stats (set it to the core.Consumer's
// Stats method) every Config.SampleEvery from New until Config.Context
// ends, keeps the last hour per minute in a bounded ring, and draws it on
// the overview. Claims over time are the processed series: a processed
// message is a claim that won. The table shows the newest and oldest
// claim as well. A console that runs apart from the consumers (the idemq
// console command) has no Stats and points to the Grafana dashboard
// instead (docs/dashboards/idemq.json).
//
// Reading never changes anything: every page is a GET, every action a POST
// that carries a token bound to the action and the user (an HMAC under a
// secret each handler draws at New) and that comes from the console's own
// origin (Sec-Fetch-Site, Origin; net/http.CrossOriginProtection). With
// Config.ReadOnly every action is refused and no button is shown. Every
// action, and every message body shown, is logged to Config.Logger with
// who did it (Config.User), what and how many. Credentials in URLs are
// never shown.
//
// The pages are rendered on the server (html/template); their stylesheet
// and a few lines of script (select all) are embedded, so the console
// works offline and loads nothing from elsewhere.
package console
