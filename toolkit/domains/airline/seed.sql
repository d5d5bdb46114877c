-- Initial state of the airline domain (loaded with the triggers switched off).
-- Boundary-adjacent on purpose: HAT170 business has 1 seat left and its cheap basic_economy is sold
-- out, gift_card_1180 cannot cover a fare,
-- reservation 1003 was booked yesterday (still cancellable), 1002 ten days ago (not cancellable).

INSERT INTO clock VALUES (1, '2024-05-15');

INSERT INTO customer VALUES
  ('mia_li_3668',     'Mia',   'Li',     'mia.li@example.com',     'gold',    '1990-04-12'),
  ('omar_davis_3817', 'Omar',  'Davis',  'omar.davis@example.com', 'regular', '1985-11-02'),
  ('sofia_kim_7290',  'Sofia', 'Kim',    'sofia.kim@example.com',  'silver',  '1993-07-21'),
  ('raj_patel_1043',  'Raj',   'Patel',  'raj.patel@example.com',  'regular', '1979-01-30'),
  ('emma_wilson_5562','Emma',  'Wilson', 'emma.w@example.com',     'gold',    '1988-09-09'),
  ('noah_brown_2211', 'Noah',  'Brown',  'noah.brown@example.com', 'silver',  '2000-02-14');

INSERT INTO payment_method VALUES
  ('credit_card_4421', 'mia_li_3668',      'credit_card', 'Visa ending 4421',       NULL,  'active'),
  ('gift_card_7791',   'mia_li_3668',      'gift_card',   'Gift card 7791',         250,   'active'),
  ('certificate_3302', 'mia_li_3668',      'certificate', 'Travel certificate 3302', 100,  'active'),
  ('credit_card_9001', 'omar_davis_3817',  'credit_card', 'Mastercard ending 9001', NULL,  'active'),
  ('gift_card_1180',   'omar_davis_3817',  'gift_card',   'Gift card 1180',         40,    'active'),
  ('credit_card_5120', 'sofia_kim_7290',   'credit_card', 'Visa ending 5120',       NULL,  'active'),
  ('certificate_8845', 'sofia_kim_7290',   'certificate', 'Travel certificate 8845', 50,   'active'),
  ('certificate_8846', 'sofia_kim_7290',   'certificate', 'Travel certificate 8846', 100,  'active'),
  ('credit_card_6633', 'raj_patel_1043',   'credit_card', 'Amex ending 6633',       NULL,  'active'),
  ('credit_card_0007', 'raj_patel_1043',   'credit_card', 'Visa ending 0007',       NULL,  'removed'),
  ('credit_card_2468', 'emma_wilson_5562', 'credit_card', 'Visa ending 2468',       NULL,  'active'),
  ('gift_card_3579',   'emma_wilson_5562', 'gift_card',   'Gift card 3579',         500,   'active'),
  ('gift_card_8642',   'noah_brown_2211',  'gift_card',   'Gift card 8642',         120,   'active');

INSERT INTO flight VALUES
  ('HAT170-2024-05-20', 'HAT170', '2024-05-20', 'JFK', 'SFO', '08:00', 'available'),
  ('HAT172-2024-05-20', 'HAT172', '2024-05-20', 'JFK', 'SFO', '17:30', 'available'),
  ('HAT201-2024-05-18', 'HAT201', '2024-05-18', 'SFO', 'SEA', '09:15', 'available'),
  ('HAT305-2024-05-16', 'HAT305', '2024-05-16', 'ORD', 'MIA', '12:00', 'cancelled'),
  ('HAT305-2024-05-22', 'HAT305', '2024-05-22', 'ORD', 'MIA', '12:00', 'available'),
  ('HAT410-2024-05-15', 'HAT410', '2024-05-15', 'BOS', 'LAX', '06:00', 'flying'),
  ('HAT510-2024-05-25', 'HAT510', '2024-05-25', 'LAX', 'JFK', '22:00', 'available'),
  ('HAT601-2024-05-19', 'HAT601', '2024-05-19', 'SEA', 'DEN', '11:00', 'delayed');

INSERT INTO flight_cabin VALUES
  ('HAT170-2024-05-20', 'basic_economy',  99, 0),
  ('HAT170-2024-05-20', 'economy',       210, 3),
  ('HAT170-2024-05-20', 'business',      520, 1),
  ('HAT172-2024-05-20', 'basic_economy', 110, 6),
  ('HAT172-2024-05-20', 'economy',       189, 9),
  ('HAT172-2024-05-20', 'business',      480, 4),
  ('HAT201-2024-05-18', 'basic_economy',  80, 5),
  ('HAT201-2024-05-18', 'economy',       149, 2),
  ('HAT201-2024-05-18', 'business',      390, 2),
  ('HAT305-2024-05-16', 'basic_economy',  95, 10),
  ('HAT305-2024-05-16', 'economy',       160, 8),
  ('HAT305-2024-05-16', 'business',      420, 3),
  ('HAT305-2024-05-22', 'basic_economy',  95, 4),
  ('HAT305-2024-05-22', 'economy',       160, 7),
  ('HAT305-2024-05-22', 'business',      420, 2),
  ('HAT410-2024-05-15', 'basic_economy', 100, 0),
  ('HAT410-2024-05-15', 'economy',       230, 1),
  ('HAT410-2024-05-15', 'business',      610, 0),
  ('HAT510-2024-05-25', 'basic_economy', 130, 3),
  ('HAT510-2024-05-25', 'economy',       240, 5),
  ('HAT510-2024-05-25', 'business',      650, 1),
  ('HAT601-2024-05-19', 'basic_economy',  70, 2),
  ('HAT601-2024-05-19', 'economy',       140, 4),
  ('HAT601-2024-05-19', 'business',      330, 2);

-- reservation_id, user_id, flight_id, cabin, passengers, insurance, total_bags, nonfree_bags, status, created_on
INSERT INTO reservation VALUES
  (1001, 'mia_li_3668',      'HAT170-2024-05-20', 'economy',       1, 'no',  2, 0, 'active',    '2024-05-01'),
  (1002, 'omar_davis_3817',  'HAT305-2024-05-22', 'basic_economy', 1, 'no',  0, 0, 'active',    '2024-05-05'),
  (1003, 'sofia_kim_7290',   'HAT201-2024-05-18', 'economy',       2, 'no',  2, 0, 'active',    '2024-05-14'),
  (1004, 'raj_patel_1043',   'HAT305-2024-05-16', 'economy',       1, 'no',  1, 0, 'active',    '2024-04-20'),
  (1005, 'emma_wilson_5562', 'HAT510-2024-05-25', 'business',      1, 'no',  3, 0, 'active',    '2024-05-02'),
  (1006, 'noah_brown_2211',  'HAT410-2024-05-15', 'economy',       1, 'yes', 1, 0, 'active',    '2024-05-10'),
  (1007, 'mia_li_3668',      'HAT601-2024-05-19', 'basic_economy', 2, 'no',  0, 0, 'active',    '2024-05-08'),
  (1008, 'sofia_kim_7290',   'HAT172-2024-05-20', 'economy',       1, 'no',  0, 0, 'cancelled', '2024-05-03');

-- payment_tx_id, reservation_id, payment_id, kind, purpose, amount
INSERT INTO payment VALUES
  (1, 1001, 'credit_card_4421', 'charge', 'booking', 210),
  (2, 1002, 'credit_card_9001', 'charge', 'booking',  95),
  (3, 1003, 'credit_card_5120', 'charge', 'booking', 248),
  (4, 1003, 'certificate_8845', 'charge', 'booking',  50),
  (5, 1004, 'credit_card_6633', 'charge', 'booking', 160),
  (6, 1005, 'gift_card_3579',   'charge', 'booking', 650),
  (7, 1006, 'gift_card_8642',   'charge', 'booking', 260),
  (8, 1007, 'credit_card_4421', 'charge', 'booking', 140),
  (9, 1008, 'credit_card_5120', 'charge', 'booking', 189),
  (10, 1008, 'credit_card_5120', 'refund', 'booking', 189);
