module github.com/idem-go/idem/broker/idemamqp

go 1.26

require github.com/idem-go/idem v0.0.0

require github.com/rabbitmq/amqp091-go v1.16.0

replace github.com/idem-go/idem => ../..
