// Package nats is the idemq broker adapter for NATS JetStream, on
// github.com/nats-io/nats.go's jetstream package. Importing it registers
// the nats:// scheme with core.OpenSource, core.OpenPublisher and
// core.OpenDeadLetters.
package nats
